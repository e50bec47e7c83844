"""A tiny "inference engine" written for notebook 07 to be audited (``python -m workbook audit``).

It is sample *user* code, not part of the workbook package: it lives beside the notebook that audits
it (the notebook imports it as ``audit_sample``), its file names are not ``test_*.py`` so pytest never
collects it, and its Triton kernels sit in its own ``kernels.py`` as an engine's would. It holds true
and false allocate-then-overwrite candidates on purpose; notebook 07 proves or refutes each.
"""
