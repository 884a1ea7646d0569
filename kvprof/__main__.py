from kvprof.cli import main

raise SystemExit(main())
