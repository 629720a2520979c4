"""The plain-data codec of the sandbox's call channel (:func:`mgrpo_verl.envs.sandbox.run_judged`).

Used by the parent and, loaded by path, by the sandboxed children (``_child.py``): it imports nothing of
ours and only ``json`` of the standard library.
"""

#: Limits of the plain-data channel of :func:`~mgrpo_verl.envs.sandbox.run_judged` (both directions).
MAX_MESSAGE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ITEMS = 100_000
MAX_CALLS = 10_000


def plain_dumps(value, max_bytes, max_depth, max_items):
    """``value`` encoded as plain data (JSON with tagged containers), or ``TypeError`` / ``ValueError`` when
    it is not plain data (an exact builtin type: None, bool, int, float, str, bytes, list, tuple, dict, set,
    frozenset) or exceeds a limit. Runs in the children and in the parent."""
    import json

    budget = [max_items]
    type_, none_, bool_, int_, float_, str_, bytes_ = type, type(None), bool, int, float, str, bytes
    tags = {list: "l", tuple: "t", set: "s", frozenset: "f"}

    def tree(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError("more than %d values" % max_items)
        t = type_(v)
        if t is none_ or t is bool_ or t is int_ or t is float_ or t is str_:
            return v
        if depth >= max_depth:
            raise ValueError("nested deeper than %d levels" % max_depth)
        if t is bytes_:
            return {"b": v.hex()}
        if t is dict:
            return {"d": [[tree(k, depth + 1), tree(x, depth + 1)] for k, x in dict.items(v)]}
        tag = tags.get(t) if t in tags else None
        if tag is None:
            raise TypeError("not plain data: a value of type " + repr(getattr(t, "__name__", "?")))
        return {tag: [tree(x, depth + 1) for x in t.__iter__(v)]}

    data = json.dumps(tree(value, 0), ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode("ascii")
    if len(data) > max_bytes:
        raise ValueError("encoded as %d bytes, more than %d" % (len(data), max_bytes))
    return data


def plain_loads(data, max_bytes, max_depth, max_items):
    """The plain value encoded in ``data`` by :func:`plain_dumps`, built from fresh builtin objects;
    ``ValueError`` (or ``TypeError`` for an unhashable set item or key) when ``data`` is anything else."""
    import json

    if type(data) is not bytes or len(data) > max_bytes:
        raise ValueError("not bytes within the size limit")
    try:
        raw = json.loads(data.decode("ascii"))
    except RecursionError as e:
        raise ValueError("nested too deeply") from e
    budget = [max_items]
    builders = {"l": list, "t": tuple, "s": set, "f": frozenset}

    def build(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError("more than %d values" % max_items)
        t = type(v)
        if v is None or t is bool or t is int or t is float or t is str:
            return v
        if depth >= max_depth or t is not dict or len(v) != 1:
            raise ValueError("not a plain-data encoding")
        ((tag, body),) = v.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise ValueError("not a plain-data encoding")
        if tag == "d":
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not a plain-data encoding")
                out[build(pair[0], depth + 1)] = build(pair[1], depth + 1)
            return out
        if tag not in builders:
            raise ValueError("not a plain-data encoding")
        return builders[tag](build(x, depth + 1) for x in body)

    return build(raw, 0)
