from shallowmirror.cli.entry import main

raise SystemExit(main())
