"""Logits reach NumPy without a copy: Model.logits hands over the buffer the forward pass wrote,
and Session.logits is a read-only view of the session's own buffer that later calls never change
(a step writes a fresh buffer while a view holds the old one)."""

import numpy as np
import pytest


def data_ptr(a):
    return a.__array_interface__["data"][0]


def test_model_logits_is_the_buffer_the_library_computed(model):
    ids = [1, 50, 60, 70, 80]
    a = model.logits(ids)
    # Not a NumPy-owned copy: the array wraps the library's vector, held by a capsule.
    assert not a.flags.owndata and type(a.base).__name__ == "PyCapsule"
    assert a.flags.c_contiguous and a.flags.writeable and a.shape == (5, model.info["vocab_size"])
    b = model.logits(ids)
    assert data_ptr(a) != data_ptr(b)  # every call's own buffer
    np.testing.assert_array_equal(a, b)


def fresh_logits(model, *chunks):
    """The last logits of a new session fed the same chunks (the same kernels, so bit-equal)."""
    s = model.session(ctx_size=64)
    for c in chunks:
        s.append_tokens(c)
    return s.logits.copy()


def test_session_logits_is_a_view_that_later_steps_leave_unchanged(model):
    prompt = model.tokenize("Once upon a time")
    g = model.session(ctx_size=64)
    assert g.logits.shape == (0,)
    g.append_tokens(prompt)
    a = g.logits
    assert not a.flags.owndata and type(a.base).__name__ == "PyCapsule"
    assert not a.flags.writeable  # the sampler reads this buffer too
    with pytest.raises(ValueError):
        a[0] = 0
    assert data_ptr(g.logits) == data_ptr(a)  # every read is a view of the same buffer
    before = a.copy()
    np.testing.assert_array_equal(a, fresh_logits(model, prompt))
    np.testing.assert_allclose(a, model.logits(prompt)[-1], rtol=0, atol=1e-4)

    tok = g.next_token()
    g.append_tokens([5])
    np.testing.assert_array_equal(a, before)  # held: the steps wrote other buffers
    b = g.logits
    assert data_ptr(b) != data_ptr(a)
    np.testing.assert_array_equal(b, fresh_logits(model, prompt, [tok], [5]))

    # Nothing else holds the session's buffer now: the next step writes into it in place.
    ptr = data_ptr(b)
    del a, b
    g.append_tokens([6])
    c = g.logits
    assert data_ptr(c) == ptr
    np.testing.assert_array_equal(c, fresh_logits(model, prompt, [tok], [5], [6]))

    # rewind_to recomputes the logits (a step of the last kept token); the old view stays as it was.
    kept = c.copy()
    g.rewind_to(len(prompt))
    np.testing.assert_array_equal(c, kept)
    np.testing.assert_array_equal(g.logits, fresh_logits(model, prompt[:-1], prompt[-1:]))


def test_forks_share_the_logits_until_one_steps(model):
    prompt = model.tokenize("The old man")
    g = model.session(ctx_size=64)
    g.append_tokens(prompt)
    f = g.fork()
    a, b = g.logits, f.logits
    assert data_ptr(a) == data_ptr(b)  # the fork did not copy them
    before = a.copy()
    f.append_tokens([7, 8])
    g.append_tokens([9])
    np.testing.assert_array_equal(a, before)
    np.testing.assert_array_equal(b, before)
    np.testing.assert_array_equal(f.logits, fresh_logits(model, prompt, [7, 8]))
    np.testing.assert_array_equal(g.logits, fresh_logits(model, prompt, [9]))
    assert len({data_ptr(a), data_ptr(f.logits), data_ptr(g.logits)}) == 3
