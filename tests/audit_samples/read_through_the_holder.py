"""A weight reached through an attribute chain, zero-filled and later restored, written after the 16th
out-of-sample check (a test that zeroes one weight of a submodule, runs the model, then copies the
weight back: the model's method reads the zeros). A method called on an object that holds the buffer
(``model``, ``model.head``), the holder called, or passed to a call, between the fill and the overwrite
may read it; a call on another object does not."""
import torch


def probe_with_a_zeroed_weight(model, x, saved):
    model.head.weight.zero_()
    out = model.sample(x)                 # model's own method: may read model.head.weight
    model.head.weight.copy_(saved)
    return out


def probe_by_calling_the_submodule(model, x, saved):
    model.head.weight.zero_()
    out = model.head(x)                   # the submodule called: reads its weight
    model.head.weight.copy_(saved)
    return out


def probe_by_passing_the_model(model, x, saved, evaluate):
    model.head.weight.zero_()
    out = evaluate(model, x)              # the model handed on: may read it
    model.head.weight.copy_(saved)
    return out


def reset_beside_another_object(model, other, x, saved):
    model.head.weight.zero_()
    out = other.sample(x)                 # another object: does not hold model.head.weight
    model.head.weight.copy_(saved)
    return out


def reset_beside_a_sibling_attribute(model, saved):
    model.head.weight.zero_()
    model.head.bias.add_(1.0)             # the sibling attribute, not a call on the holder
    model.head.weight.copy_(saved)
    return model


def reset_after_a_type_check(model, saved):
    model.head.weight.zero_()
    assert isinstance(model, torch.nn.Module)   # looks at the object, not at its weights
    model.head.weight.copy_(saved)
    return model


def zeroed_read_after_a_call(model, x):
    model.head.weight.zero_()
    model.prepare(x)
    return model.head.weight.sum()           # read: the fill is needed, whatever prepare does


def zeroed_again_after_a_call(buf, x):
    buf.storage.zero_()
    pack(buf, x)                             # writes part of it through buf
    buf.storage.zero_()                      # a reset: judged necessary, as without the call
    return buf.storage.sum()
