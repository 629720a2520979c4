"""A tiny random Qwen2 model and a locally trained byte-level BPE tokenizer, built offline.

Everything here is deterministic: the tokenizer is trained on a corpus generated from a fixed seed, and
the model's weights are drawn from ``torch.manual_seed(seed)``. Results are cached under
:func:`cache_root` in directories named by a hash of every build parameter and :data:`BUILDER_VERSION`,
so each variant is built once per machine (a file lock makes concurrent builders, e.g. several Ray
workers, wait for the first one).

Layout (one tokenizer is shared by every model seed)::

    <cache_root>/tokenizers/bpe-<hash>/       tokenizer.json, tokenizer_config.json, chat template
    <cache_root>/models/tiny-qwen2-<hash>/    config.json, generation_config.json, model.safetensors

The tokenizer deliberately lives in its own directory without a ``config.json``: with transformers 5.10
``AutoTokenizer`` ignores ``tokenizer_class`` when a ``config.json`` with ``model_type: qwen2`` sits next
to it and builds a tokenizer that encodes most text to nothing (docs/cpu.md). Point verl's
``actor_rollout_ref.model.tokenizer_path`` at :attr:`TinyModelPaths.tokenizer_dir`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

#: Bump when the corpus, the tokenizer recipe or the model recipe changes: it is part of every cache key, so old
#: caches are simply ignored (the chat template is hashed into the tokenizer's key itself).
BUILDER_VERSION = "1"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
#: Added as ordinary (non-special) single tokens so tool calls and reasoning tags are cheap to emit.
EXTRA_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

#: Qwen2's pre-tokenizer split: digits are isolated, ``\n`` runs are their own pre-tokens.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ChatML (Qwen2.5 style, with tools and tool responses) without Qwen's default system prompt and without
#: Qwen2.5's tool instructions (the two paragraphs around ``<tools>`` on how to call a function): they are 171
#: tokens of this tokenizer that a tiny model reads in every prompt and cannot understand (it learns the call
#: format from demonstrations), 40 % of a ``relay_tools`` demonstration; the tool schemas stay. The tokenizer's
#: cache key hashes this template.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}"
    "{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class TinyModelPaths(NamedTuple):
    """Where a built model lives. Unpacks as ``model_dir, tokenizer_dir = build_tiny_model()``."""

    model_dir: str
    tokenizer_dir: str


def cache_root() -> Path:
    """``$MGRPO_VERL_CACHE``, else ``$XDG_CACHE_HOME/mgrpo_verl``, else ``~/.cache/mgrpo_verl``."""
    explicit = os.environ.get("MGRPO_VERL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mgrpo_verl"


#: Hex digits of a :func:`content_key`; a cached build's folder is ``{name}-{content_key}``.
KEY_CHARS = 16


def content_key(payload: dict[str, Any]) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:KEY_CHARS]


def cached_name(path: str | Path) -> str:
    """The name of a cached build's folder without its content key (``tiny-qwen2-<key>`` -> ``tiny-qwen2``); any
    other folder's own name."""
    return re.sub(rf"-[0-9a-f]{{{KEY_CHARS}}}$", "", Path(path).name)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(target: Path, build) -> Path:
    """Run ``build(tmp_dir)`` unless ``target`` exists; publish atomically with a rename. Temporary folders of
    ``target`` found while holding its lock are a killed build's (only the lock's holder makes one): removed."""
    if target.is_dir():
        return target
    with _locked(target.with_name(target.name + ".lock")):
        if target.is_dir():  # built by someone else while we waited
            return target
        for stale in target.parent.glob(glob.escape(target.name) + ".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            build(tmp)
            for path in [tmp, *tmp.rglob("*")]:  # mkdtemp and some writers use 0o700 / 0o600
                path.chmod(0o755 if path.is_dir() else 0o644)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


# --------------------------------------------------------------------------------------------------
# corpus
# --------------------------------------------------------------------------------------------------

_WORDS = (
    "the of and to a in is it you that he was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn plant cover food sun "
    "four between state keep eye never last let thought city tree cross farm hard start might story saw far sea "
    "draw left late run while press close night real life few north open seem together next white children "
    "begin got walk example ease paper group always music those both mark often letter until mile river car "
    "feet care second book carry took science eat room friend began idea fish mountain stop once base hear horse "
    "cut sure watch color face wood main enough plain girl usual young ready above ever red list though feel "
    "talk bird soon body dog family direct pose leave song measure door product black short numeral class wind "
    "question happen complete ship area half rock order fire south problem piece told knew pass since top whole "
    "king space heard best hour better true during hundred five remember step early hold west ground interest "
    "reach fast verb sing listen six table travel less morning ten simple several vowel toward war lay against "
    "pattern slow center love person money serve appear road map rain rule govern pull cold notice voice unit "
    "power town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest "
    "correct able pound done beauty drive stood contain front teach week final gave green oh quick develop ocean "
    "warm free minute strong special mind behind clear tail produce fact street inch multiply nothing course "
    "stay wheel full force blue object decide surface deep moon island foot system busy test record boat common "
    "gold possible plane stead dry wonder laugh thousand ago ran check game shape equate miss brought heat snow "
    "tire bring yes distant fill east paint language among agent task answer result reward question search "
    "delegate sub main tool call return value sum total add subtract multiply divide equals plus minus times"
).split()

_NAMES = "Alice Bob Carol Dave Eve Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent Victor Walter".split()

_CODE = (
    "def {f}({a}, {b}):\n    return {a} {op} {b}\n",
    "def {f}(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n",
    "for i in range({n}):\n    print(i, i * {n})\n",
    "if {a} > {b}:\n    result = {a}\nelse:\n    result = {b}\n",
    "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n\n    def get(self):\n        return self.{a}\n",
    'import math\n\n\ndef {f}({a}: int) -> int:\n    """Return the {w} of {a}."""\n    return math.isqrt({a})\n',
    "{a} = [{n}, {m}, {k}]\nassert {f}({a}) == {n} + {m} + {k}\n",
    "while {a} < {n}:\n    {a} += 1\n",
)


def _corpus(n_lines: int = 12000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    ops = ["+", "-", "*"]
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 8
        if kind == 0:
            words = rng.choices(_WORDS, k=rng.randint(5, 14))
            lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
        elif kind == 1:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            op = rng.choice(ops)
            val = {"+": a + b, "-": a - b, "*": a * b}[op]
            lines.append(f"What is {a} {op} {b}? The answer is {val}.")
        elif kind == 2:
            a, b, c = rng.randint(1, 99), rng.randint(1, 99), rng.randint(1, 99)
            who = rng.choice(_NAMES)
            lines.append(f"{who} has {a} apples, buys {b} more and gives away {c}. Now {who} has {a + b - c}.")
        elif kind == 3:
            tpl = rng.choice(_CODE)
            f = rng.choice(["add", "solve", "compute", "count", "total", "helper", "main", "sub_agent"])
            a, b = rng.sample(["x", "y", "n", "value", "items", "left", "right", "a", "b"], 2)
            lines.append(
                tpl.format(
                    f=f,
                    F=f.capitalize(),
                    a=a,
                    b=b,
                    op=rng.choice(ops),
                    n=rng.randint(0, 99),
                    m=rng.randint(0, 99),
                    k=rng.randint(0, 99),
                    w=rng.choice(_WORDS),
                )
            )
        elif kind == 4:
            args = {"a": rng.randint(0, 999), "b": rng.randint(0, 999)}
            name = rng.choice(["add", "search", "delegate", "calculator", "lookup"])
            lines.append(
                f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>\n'
                f"<tool_response>\n{args['a'] + args['b']}\n</tool_response>"
            )
        elif kind == 5:
            q = " ".join(rng.choices(_WORDS, k=rng.randint(3, 8)))
            a = " ".join(rng.choices(_WORDS, k=rng.randint(2, 6)))
            lines.append(f"{IM_START}user\n{q}?{IM_END}\n{IM_START}assistant\n{a}.{IM_END}\n")
        elif kind == 6:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 8))))
        else:
            words = rng.choices(_WORDS, k=rng.randint(3, 9))
            lines.append("\t" + " ".join(w.upper() if rng.random() < 0.1 else w for w in words) + " ;\n\n")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------


def _train_tokenizer(out_dir: Path, vocab_size: int, model_max_length: int) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _corpus()
    tok.train_from_iterator(corpus.split("\n\n"), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_TOKENS])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    hf_tok.save_pretrained(str(out_dir))
    # Self-check before publishing: the failure mode we guard against is a tokenizer that silently
    # encodes text to nothing or splits "\n".
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(out_dir))
    text = "Alice has 12 apples.\nWhat is 3 + 4?"
    ids = loaded.encode(text, add_special_tokens=False)
    if loaded.decode(ids) != text:
        raise RuntimeError(f"tiny tokenizer does not round-trip: {text!r} -> {ids} -> {loaded.decode(ids)!r}")
    if len(loaded.encode("\n", add_special_tokens=False)) != 1:
        raise RuntimeError('tiny tokenizer encodes "\\n" to more than one token')


def build_tiny_tokenizer(vocab_size: int = 1024, model_max_length: int = 4096) -> str:
    """Train (once) and return the directory of the tiny byte-level BPE tokenizer.

    ``vocab_size`` counts the trained vocabulary including the three special tokens; the final
    tokenizer also has the :data:`EXTRA_TOKENS`, so ``len(tokenizer) == vocab_size + len(EXTRA_TOKENS)``.
    """
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {vocab_size}")
    key = content_key({"v": BUILDER_VERSION, "kind": "bpe", "vocab_size": vocab_size, "max_len": model_max_length,
                       "template": CHAT_TEMPLATE})
    target = cache_root() / "tokenizers" / f"bpe-{key}"
    build_once(target, lambda tmp: _train_tokenizer(tmp, vocab_size, model_max_length))
    return str(target)


# --------------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------------


def tiny_qwen2_config(vocab_size: int, **overrides: Any):
    """The Qwen2 config of the tiny model (hidden 64, 2 layers, 4 heads / 2 KV heads, fp32)."""
    from transformers import Qwen2Config

    params: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
        initializer_range=0.02,
    )
    params.update(overrides)
    return Qwen2Config(**params)


def _build_model(out_dir: Path, tokenizer_dir: str, seed: int, overrides: dict[str, Any]) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_qwen2_config(
        len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        **overrides,
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=config.pad_token_id,
        bos_token_id=None,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build_tiny_model(
    seed: int = 0,
    vocab_size: int = 1024,
    config_overrides: dict[str, Any] | None = None,
) -> TinyModelPaths:
    """Build (once per parameter set) a tiny random Qwen2 model and its tokenizer.

    Args:
        seed: weight-initialisation seed; the same seed always gives bit-identical weights.
        vocab_size: trained BPE vocabulary (see :func:`build_tiny_tokenizer`).
        config_overrides: extra :class:`transformers.Qwen2Config` fields (e.g. ``num_hidden_layers=4``).

    Returns:
        ``(model_dir, tokenizer_dir)``: give ``model_dir`` to ``actor_rollout_ref.model.path`` and
        ``tokenizer_dir`` to ``actor_rollout_ref.model.tokenizer_path``.
    """
    tokenizer_dir = build_tiny_tokenizer(vocab_size)
    overrides = dict(config_overrides or {})
    key = content_key(
        {
            "v": BUILDER_VERSION,
            "kind": "tiny-qwen2",
            "seed": int(seed),
            "tokenizer": Path(tokenizer_dir).name,
            "overrides": overrides,
        }
    )
    target = cache_root() / "models" / f"tiny-qwen2-{key}"
    build_once(target, lambda tmp: _build_model(tmp, tokenizer_dir, int(seed), overrides))
    return TinyModelPaths(model_dir=str(target), tokenizer_dir=tokenizer_dir)
