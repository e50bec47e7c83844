"""``python -m workbook.audit PATH...``: the same as ``python -m workbook audit PATH...``."""
from .cli import main
from ..__main__ import _hard_exit

_hard_exit(main())
