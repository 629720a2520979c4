"""verl tools of the deep-research environment.

:class:`SearchTool` (``search``) and :class:`VisitTool` (``visit``): the sub-agent's tools over the offline
corpus; :class:`ReasonTool` (``reason``): the main agent's think step; :class:`WebSearchTool` (``web_search``):
a real web-search API adapter, off by default. verl ``BaseTool`` subclasses; unlike verl's tools, bad input is
never raised but answered with an ``<error: ...>`` observation the model can act on. Configs, and why:
``docs/research.md``, "The pieces" and "Two rollouts, one task".
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import aiohttp
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from mgrpo_verl.envs.research.articles import summaries_path
from mgrpo_verl.envs.research.corpus import (
    NO_RESULTS_HINT,
    Corpus,
    UnknownDocument,
    format_hits,
    format_page,
    shorten,
)

#: The most results one search may ask for (config ``top_k`` and the call's ``top_k``).
MAX_TOP_K = 10

#: The fewest characters a page of ``visit`` may have (smaller pages only waste turns).
MIN_PAGE_CHARS = 100

#: The longest arguments string a tool parses (characters; the tool loop's own cap, ``MAX_CALL_CHARS`` of
#: :mod:`mgrpo_verl.agent_loops.tool_parser`, has the same value): longer ones are refused before decoding.
MAX_ARGUMENTS_CHARS = 16_384

ToolResult = tuple[ToolResponse, float, dict]


class ToolInputError(ValueError):
    """A tool call's arguments are unusable; the message is shown to the model (inside ``<error: ...>``)."""


def error_response(message: str) -> ToolResult:
    """The observation of a failed call: ``<error: message>``, reward 0.0, info ``{"error": True}``."""
    return ToolResponse(text=f"<error: {message}>"), 0.0, {"error": True}


# -- argument parsing (lenient where the meaning is clear, an error observation otherwise) -------------------


def _arguments(tool: str, parameters: Any) -> dict[str, Any]:
    """The call's arguments as a dict: a dict as is, a JSON object string parsed, ``None`` as ``{}``. A string
    over :data:`MAX_ARGUMENTS_CHARS` is refused unread; one the decoder cannot read (a syntax error, nesting
    too deep for it, an int over Python's digit limit) is an error too, never an exception out of the tool."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        if len(parameters) > MAX_ARGUMENTS_CHARS:
            raise ToolInputError(
                f"{tool} takes a JSON object of arguments of at most {MAX_ARGUMENTS_CHARS} characters, "
                f"got {len(parameters)}"
            )
        try:
            parameters = json.loads(parameters) if parameters.strip() else {}
        except (ValueError, RecursionError, MemoryError):  # json.JSONDecodeError is a ValueError
            raise ToolInputError(
                f"{tool} takes a JSON object of arguments; could not parse {shorten(parameters, 80)!r}"
            ) from None
    if not isinstance(parameters, Mapping):
        raise ToolInputError(f"{tool} takes a JSON object of arguments, got {type(parameters).__name__}")
    return dict(parameters)


def _preview(value: Any, limit: int) -> str:
    """``repr(value)`` shortened, for error messages; never raises (a list nested too deeply for ``repr``)."""
    try:
        return shorten(repr(value), limit)
    except (RecursionError, MemoryError, ValueError):
        return "(nested too deeply to show)"


def _type_name(value: Any) -> str:
    """The JSON type name of ``value`` for error messages (what the model wrote, in its terms)."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _text_arg(args: dict[str, Any], name: str, example: str, max_chars: Optional[int] = None) -> str:
    """The required string argument ``name``, stripped; errors for missing, non-string, blank or too long."""
    if name not in args or args[name] is None:
        raise ToolInputError(f"missing the required argument {name!r} (a string), e.g. {example}")
    value = args[name]
    if not isinstance(value, str):
        raise ToolInputError(f"{name!r} must be a string, got {_type_name(value)} {_preview(value, 60)}")
    value = value.strip()
    if not value:
        raise ToolInputError(f"{name!r} is empty; give it some text, e.g. {example}")
    if max_chars is not None and len(value) > max_chars:
        raise ToolInputError(f"{name!r} is {len(value)} characters long; the limit is {max_chars}. Shorten it.")
    return value


def _int_arg(args: dict[str, Any], name: str, default: int, low: int, high: Optional[int] = None) -> int:
    """The optional integer argument ``name`` (``default`` when absent or null), in ``[low, high]``.

    Accepts ints, integral floats (``2.0``) and integer strings (``"2"``, `` " 2 " ``); not booleans.
    """
    value = args.get(name)
    if value is None:
        return default
    span = f"from {low} to {high}" if high is not None else f"of at least {low}"
    number: Optional[int] = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise ToolInputError(f"{name!r} must be an integer {span}, got {_type_name(value)} {_preview(value, 40)}")
    if number < low or (high is not None and number > high):
        raise ToolInputError(f"{name!r} must be an integer {span}, got {number}")
    return number


# -- configuration --------------------------------------------------------------------------------------------


def _config_int(config: Mapping[str, Any], key: str, default: int, low: int, high: Optional[int] = None) -> int:
    """An integer config value; ``ValueError`` naming the key when it is not an int in ``[low, high]``."""
    value = config.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"tool config {key!r} must be an integer in {span}, got {value!r}")
    return value


def _check_keys(tool: str, config: Mapping[str, Any], allowed: set[str]) -> None:
    """Unknown config keys are typos: fail loudly rather than silently use a default."""
    unknown = sorted(set(config) - allowed - {"type"})
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown} for the {tool} tool; known: {sorted(allowed)}")


def _corpus_path(config: Mapping[str, Any]) -> Optional[str]:
    """The config's ``corpus`` (a summaries JSON in the package layout), checked to exist; ``None`` for the
    installed package's file (checked too, so a missing package fails when the tool is built)."""
    path = config.get("corpus")
    if path in (None, ""):
        summaries_path()  # raises FileNotFoundError with an install hint
        return None
    if not isinstance(path, str) or not Path(path).is_file():
        raise ValueError(f"tool config 'corpus' must be the path of a summaries JSON file, got {path!r}")
    return path


def _schema(
    name: str, description: str, properties: dict[str, dict[str, str]], required: list[str]
) -> OpenAIFunctionToolSchema:
    """An OpenAI function tool schema."""
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }
    )


def search_schema(top_k: int = 5, name: str = "search") -> OpenAIFunctionToolSchema:
    """The default schema of :class:`SearchTool` (and, with ``name="web_search"``, of :class:`WebSearchTool`)."""
    where = "the web" if name == "web_search" else "the encyclopedia (Wikipedia article summaries)"
    return _schema(
        name,
        f"Search {where} by keywords. Returns a numbered list of titles with snippets"
        + ("." if name == "web_search" else "; read an article with visit(doc=<title>)."),
        {
            "query": {"type": "string", "description": "A few keywords, e.g. a name and a key term."},
            "top_k": {"type": "integer", "description": f"How many results (1-{MAX_TOP_K}, default {top_k})."},
        },
        ["query"],
    )


def visit_schema(name: str = "visit") -> OpenAIFunctionToolSchema:
    """The default schema of :class:`VisitTool`."""
    return _schema(
        name,
        "Read an encyclopedia article, one page at a time.",
        {
            "doc": {"type": "string", "description": "The article's title, exactly as search listed it."},
            "page": {"type": "integer", "description": "Which page to read (default 1)."},
        },
        ["doc"],
    )


def reason_schema(name: str = "reason") -> OpenAIFunctionToolSchema:
    """The default schema of :class:`ReasonTool`."""
    return _schema(
        name,
        "Think step by step before acting: write down your reasoning, a plan or what is still unknown.",
        {"thought": {"type": "string", "description": "Your reasoning."}},
        ["thought"],
    )


# -- tools -----------------------------------------------------------------------------------------------------


class _ResearchTool(BaseTool):
    """Common part: turns :class:`ToolInputError` from :meth:`_run` into an error observation.

    The corpus tools share the process-wide :class:`Corpus` of their ``corpus`` path; it is loaded and
    indexed on the first call, in a worker thread (``asyncio.to_thread``), so building a tool is cheap
    (verl's dataset builds tools just to read their schemas) and the event loop is never blocked for the
    second or so the 10k-article index takes.
    """

    _corpus_file: Optional[str] = None
    _corpus: Optional[Corpus] = None

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        """Run the call; bad arguments answer ``<error: ...>`` (never raise)."""
        try:
            return await self._run(instance_id, _arguments(self.name, parameters))
        except ToolInputError as e:
            return error_response(str(e))

    async def _run(self, instance_id: str, args: dict[str, Any]) -> ToolResult:
        raise NotImplementedError

    async def corpus(self) -> Corpus:
        """The tool's corpus, loaded and indexed (off the event loop the first time)."""
        if self._corpus is None:
            self._corpus = await asyncio.to_thread(self._load_corpus)
        return self._corpus

    def _load_corpus(self) -> Corpus:
        corpus = Corpus.load(self._corpus_file)
        corpus.build_index()
        return corpus


class SearchTool(_ResearchTool):
    """``search(query, top_k?)``: BM25 search of the corpus; answers :func:`~.corpus.format_hits` text.

    Config: ``top_k`` (default results per call, 5, at most :data:`MAX_TOP_K`), ``max_query_chars`` (300;
    longer queries are refused: BM25 over a pasted paragraph matches everything), ``corpus`` (path of a
    summaries JSON in the package layout; default the installed package's). Info: ``{"hits": n}``.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        config = dict(config or {})
        _check_keys("search", config, {"top_k", "max_query_chars", "corpus"})
        self.top_k = _config_int(config, "top_k", 5, 1, MAX_TOP_K)
        self.max_query_chars = _config_int(config, "max_query_chars", 300, 1)
        self._corpus_file = _corpus_path(config)
        super().__init__(config, tool_schema or search_schema(self.top_k))

    async def _run(self, instance_id: str, args: dict[str, Any]) -> ToolResult:
        query = _text_arg(args, "query", '{"query": "Stanley Kubrick film"}', self.max_query_chars)
        k = _int_arg(args, "top_k", self.top_k, 1, MAX_TOP_K)
        hits = (await self.corpus()).search(query, k)
        return ToolResponse(text=format_hits(query, hits)), 0.0, {"hits": len(hits)}


def _strip_wrapping(text: str) -> str:
    """``text`` without surrounding quotes, brackets or markdown emphasis (models often copy ``[Title]`` from a
    page header, quote the title or write ``**Title**``); up to three layers."""
    pairs = {'"': '"', "'": "'", "[": "]", "(": ")", "“": "”", "‘": "’", "«": "»", "`": "`", "*": "*"}
    for _ in range(3):
        if len(text) >= 2 and pairs.get(text[0]) == text[-1]:
            text = text[1:-1].strip()
    return text


class VisitTool(_ResearchTool):
    """``visit(doc, page?)``: one page of an article (:func:`~.corpus.format_page` text).

    ``doc`` is a title (exact, or equal ignoring case and spacing, or that wrapped in quotes/brackets).
    Config: ``page_chars`` (600, at least :data:`MIN_PAGE_CHARS`), ``max_doc_chars`` (300; a longer ``doc`` is
    refused before the title lookup: an unknown title is matched by BM25 for suggestions, on the event loop,
    and 52 kB took 27.5 s; the corpus's longest title has 62 characters), ``corpus``. Info: ``{"page": i,
    "pages": n}``.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        config = dict(config or {})
        _check_keys("visit", config, {"page_chars", "max_doc_chars", "corpus"})
        self.page_chars = _config_int(config, "page_chars", 600, MIN_PAGE_CHARS)
        self.max_doc_chars = _config_int(config, "max_doc_chars", 300, 1)
        self._corpus_file = _corpus_path(config)
        super().__init__(config, tool_schema or visit_schema())

    async def _run(self, instance_id: str, args: dict[str, Any]) -> ToolResult:
        doc = _text_arg(args, "doc", '{"doc": "Stanley Kubrick"} (a title from the search results)', self.max_doc_chars)
        page = _int_arg(args, "page", 1, 1)
        corpus = await self.corpus()
        title = corpus.lookup(doc) or corpus.lookup(_strip_wrapping(doc)) or doc
        try:
            result = corpus.page(title, page, self.page_chars)
        except UnknownDocument as e:
            hint = "Use a title exactly as search lists it"
            if e.suggestions:
                hint = "Did you mean: " + "; ".join(e.suggestions) + "? " + hint
            raise ToolInputError(f"no document titled {doc!r}. {hint}, or search first.") from None
        except ValueError:
            pages = corpus.page(title, 1, self.page_chars).pages
            raise ToolInputError(
                f"{title!r} has {pages} page{'s' if pages != 1 else ''}; page {page} does not exist. "
                f"Use a page from 1 to {pages}."
            ) from None
        return ToolResponse(text=format_page(result)), 0.0, {"page": result.page, "pages": result.pages}


class ReasonTool(BaseTool):
    """``reason(thought)``: the main agent's scratchpad. Records the thought and answers ``Noted: <thought>``
    (truncated to config ``max_chars``, default 500). Info: ``{"chars": len(thought)}``.

    Why a tool that does nothing: M-GRPO's planner (main agent) has a reason tool next to its delegation
    tool. Here it is a think step that costs a turn but no external call, so the main agent can plan, or
    take stock of sub-agent reports, in its own action space, and RL can learn when that pays. The echo
    keeps the conversation well-formed (every tool call gets a tool message) and shows what was recorded.

    The thoughts of an instance are kept until ``release`` (verl creates one instance per call); read them
    with :meth:`thoughts`.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        config = dict(config or {})
        _check_keys("reason", config, {"max_chars"})
        self.max_chars = _config_int(config, "max_chars", 500, 1)
        self._thoughts: dict[str, list[str]] = {}
        super().__init__(config, tool_schema or reason_schema())

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        """Record the thought; ``Noted: <thought, shortened>``; bad arguments answer ``<error: ...>``."""
        try:
            thought = _text_arg(_arguments(self.name, parameters), "thought", '{"thought": "First find X, then Y."}')
        except ToolInputError as e:
            return error_response(str(e))
        self._thoughts.setdefault(instance_id, []).append(thought)
        return ToolResponse(text=f"Noted: {shorten(thought, self.max_chars)}"), 0.0, {"chars": len(thought)}

    def thoughts(self, instance_id: str) -> list[str]:
        """The thoughts recorded by ``instance_id`` so far (empty after release)."""
        return list(self._thoughts.get(instance_id, ()))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._thoughts.pop(instance_id, None)


# -- web search ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebHit:
    """One web result: ``title``, ``snippet`` (may be empty) and ``url``."""

    title: str
    snippet: str
    url: str


def format_web_hits(query: str, hits: list[WebHit]) -> str:
    """``1. <title> — <snippet> (<url>)`` per hit (``— <snippet>`` left out when empty), or "No results"."""
    if not hits:
        return f"No results for '{query}'. {NO_RESULTS_HINT}"
    lines = []
    for n, hit in enumerate(hits, 1):
        body = f"{hit.title} — {hit.snippet}" if hit.snippet else hit.title
        lines.append(f"{n}. {body} ({hit.url})" if hit.url else f"{n}. {body}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Provider:
    """How to call one web-search API and read its answer."""

    method: str  # "GET" or "POST"
    default_endpoint: Optional[str]
    results_key: str  # the list of results in the JSON answer
    url_key: str
    snippet_key: str


PROVIDERS: dict[str, _Provider] = {
    # SearXNG (self-hosted metasearch): GET {endpoint}/search?q=...&format=json -> results[].title/url/content
    "searxng": _Provider("GET", None, "results", "url", "content"),
    # Serper (Google results): POST {endpoint}/search {"q": ...}, header X-API-KEY -> organic[].title/link/snippet
    "serper": _Provider("POST", "https://google.serper.dev", "organic", "link", "snippet"),
}


class WebSearchTool(BaseTool):
    """``web_search(query, top_k?)``: a real web-search HTTP API, for runs that may use the internet.

    Off by default (only ``research_web_tools.yaml`` names it): the project's environment is offline, and
    web results change over time, so runs with it are not reproducible.

    Config: ``provider`` (``searxng`` or ``serper``), ``endpoint`` (base URL; required for searxng, default
    ``https://google.serper.dev`` for serper), ``api_key_env`` (the name of the environment variable holding
    the key: sent as ``X-API-KEY`` to serper, as ``Authorization: Bearer`` to searxng; required for serper),
    ``timeout_s`` (10), ``top_k`` (5, at most :data:`MAX_TOP_K`), ``max_query_chars`` (300).

    HTTP errors, timeouts, unreachable servers and malformed answers become ``<error: ...>`` observations.
    Each call opens its own ``aiohttp`` session: sessions are bound to an event loop, and verl may run tools
    from more than one.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        config = dict(config or {})
        known = {"provider", "endpoint", "api_key_env", "timeout_s", "top_k", "max_query_chars"}
        _check_keys("web_search", config, known)
        provider = config.get("provider", "searxng")
        if provider not in PROVIDERS:
            raise ValueError(f"tool config 'provider' must be one of {sorted(PROVIDERS)}, got {provider!r}")
        self.provider = provider
        spec = PROVIDERS[provider]
        endpoint = config.get("endpoint") or spec.default_endpoint
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"tool config 'endpoint' must be an http(s) base URL for provider {provider!r}, got {endpoint!r}"
            )
        self.endpoint = endpoint.rstrip("/")
        key_env = config.get("api_key_env")
        self.api_key: Optional[str] = None
        if key_env:
            self.api_key = os.environ.get(str(key_env))
            if not self.api_key:
                raise ValueError(
                    f"tool config 'api_key_env' names the environment variable {key_env!r}, which is not set"
                )
        elif provider == "serper":
            raise ValueError(
                "the serper provider needs an API key: set tool config 'api_key_env' to the name of its variable"
            )
        timeout = config.get("timeout_s", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"tool config 'timeout_s' must be a positive number, got {timeout!r}")
        self.timeout_s = float(timeout)
        self.top_k = _config_int(config, "top_k", 5, 1, MAX_TOP_K)
        self.max_query_chars = _config_int(config, "max_query_chars", 300, 1)
        super().__init__(config, tool_schema or search_schema(self.top_k, name="web_search"))

    def _request(self, query: str, k: int) -> dict[str, Any]:
        """``aiohttp`` request arguments (method, url, params/json, headers) of one search."""
        url = f"{self.endpoint}/search"
        if self.provider == "serper":
            headers = {"X-API-KEY": self.api_key or "", "Content-Type": "application/json"}
            return {"method": "POST", "url": url, "json": {"q": query, "num": k}, "headers": headers}
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"method": "GET", "url": url, "params": {"q": query, "format": "json"}, "headers": headers}

    def _parse(self, data: Any, k: int) -> list[WebHit]:
        """The first ``k`` usable results of the API's JSON answer. Raises ``ToolInputError`` if malformed."""
        spec = PROVIDERS[self.provider]
        results = data.get(spec.results_key, []) if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise ToolInputError(
                f"web search got a malformed answer from {self.provider} (no '{spec.results_key}' list)"
            )
        hits = []
        for item in results:
            if not isinstance(item, dict):
                continue
            title = " ".join(str(item.get("title") or "").split())
            url = str(item.get(spec.url_key) or "").strip()
            if not title and not url:
                continue
            hits.append(WebHit(title or url, shorten(str(item.get(spec.snippet_key) or "")), url))
            if len(hits) == k:
                break
        return hits

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        """One web search; every failure is an ``<error: ...>`` observation (never raises)."""
        try:
            args = _arguments(self.name, parameters)
            query = _text_arg(args, "query", '{"query": "Stanley Kubrick film"}', self.max_query_chars)
            k = _int_arg(args, "top_k", self.top_k, 1, MAX_TOP_K)
            request = self._request(query, k)
            retry = "Try again, or rephrase the query"
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
                    async with session.request(**request) as reply:
                        if reply.status != 200:
                            raise ToolInputError(
                                f"web search failed: HTTP {reply.status} from {self.provider}. {retry}."
                            )
                        body = await reply.text()
            except TimeoutError:  # asyncio.TimeoutError and aiohttp's timeouts are TimeoutError in 3.11
                raise ToolInputError(f"web search timed out after {self.timeout_s:g} s. {retry}.") from None
            except (aiohttp.ClientError, OSError) as e:
                raise ToolInputError(
                    f"web search could not reach {self.provider} ({type(e).__name__}). {retry}."
                ) from None
            try:
                data = json.loads(body)
            except ValueError:
                raise ToolInputError(
                    f"web search got an answer from {self.provider} that is not JSON. {retry}."
                ) from None
            hits = self._parse(data, k)
        except ToolInputError as e:
            return error_response(str(e))
        return ToolResponse(text=format_web_hits(query, hits)), 0.0, {"hits": len(hits)}


#: The tool classes by their default names (what the YAML configs name).
TOOLS: dict[str, type[BaseTool]] = {
    "search": SearchTool,
    "visit": VisitTool,
    "reason": ReasonTool,
    "web_search": WebSearchTool,
}

__all__ = [
    "MAX_TOP_K",
    "MIN_PAGE_CHARS",
    "PROVIDERS",
    "TOOLS",
    "ReasonTool",
    "SearchTool",
    "ToolInputError",
    "VisitTool",
    "WebHit",
    "WebSearchTool",
    "error_response",
    "format_web_hits",
    "reason_schema",
    "search_schema",
    "visit_schema",
]
