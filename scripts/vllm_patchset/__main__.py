from vllm_patchset.cli import main

raise SystemExit(main())
