"""``python -m workbook.audit PATH...``: the same as ``python -m workbook audit PATH...``."""
import sys

from .cli import main

sys.exit(main())
