"""The suite's root: its folder is on ``sys.path`` so every test module can import
:mod:`testkit` (the helpers shared by more than one folder)."""
