"""MirrorMaker 2's offset half: MM2 record encodings, offset syncs, exact offset translation,
checkpoints and the failover tools built on them."""
