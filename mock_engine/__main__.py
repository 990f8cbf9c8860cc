from mock_engine.cli import main

raise SystemExit(main())
