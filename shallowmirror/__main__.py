from shallowmirror.cli.main import main

raise SystemExit(main())
