"""Class 2: a custom op's mutates_args says 'mutated', its own words say how."""
import torch


@torch.library.custom_op("samples::moe_sum", mutates_args=("out",))
def moe_sum(x: torch.Tensor, out: torch.Tensor) -> None:
    """Accumulates the expert outputs of x into out."""
    torch.ops.samples_ext.moe_sum(x, out)


@torch.library.custom_op("samples::rows_quant", mutates_args=("out",))
def rows_quant(x: torch.Tensor, out: torch.Tensor) -> None:
    # writes the real rows of out; the padding rows are left untouched
    torch.ops.samples_ext.rows_quant(x, out)


@torch.library.custom_op("samples::plain_quant", mutates_args=("out",))
def plain_quant(x: torch.Tensor, out: torch.Tensor) -> None:
    """Quantizes x into out."""
    torch.ops.samples_ext.plain_quant(x, out)


def combine(x):
    out = torch.zeros(x.shape[1], x.shape[2])
    moe_sum(x, out)
    return out


def quant_padded(x, rows):
    out = torch.zeros(rows, x.shape[1], dtype=torch.int8)
    rows_quant(x, out)
    return out


def quant(x):
    out = torch.zeros_like(x, dtype=torch.int8)
    plain_quant(x, out)
    return out
