from smollab.cli import main

raise SystemExit(main())
