"""Entry point of a self-contained bundle: the window, and the runner it starts.

A frozen bundle has no `python -m engine.runner`; the bundle's own executable is started with
`-m engine.runner ...` instead (sys.executable is the bundle), so both roles live in one file.
"""

import sys

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "-m":
        module, sys.argv = sys.argv[2], [sys.argv[2]] + sys.argv[3:]
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        from workbench.app import main

        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
