"""Rewards of the deep-research task (mgrpo_verl/envs/research/rewards.py): answer extraction, EM / F1,
the scorer entries, verl's compute_score and the optional LLM judge (against a fake local server)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.envs import relay
from mgrpo_verl.envs.research import rewards as R

# ----------------------------------------------------------------------------------------------------
# normalisation and metrics


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel-Tower!", "eiffeltower"),  # lower, "-" and "!" removed, "the" removed, spaces collapsed
        ("An apple a day", "apple day"),
        ("1775–1817", "17751817"),  # en dash is punctuation too
        ("1775-1817", "17751817"),
        ("“Quoted”  text\n", "quoted text"),
        ("Theory", "theory"),  # "the" only as a whole word
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert R.normalize_answer(text) == expected


def test_f1_by_hand():
    # pred [stanley, kubrick], gold [kubrick]: common 1, P = 1/2, R = 1/1, F1 = 2 * 1/2 * 1 / (3/2) = 2/3
    assert R.f1("Stanley Kubrick", ["Kubrick"]) == pytest.approx(2 / 3)
    # pred [1968, film, by, kubrick] (the article dropped), gold [1968, film, by, stanley, kubrick]:
    # common 4, P = 4/4, R = 4/5, F1 = 2 * 1 * 0.8 / 1.8 = 8/9
    assert R.f1("the 1968 film by Kubrick", ["1968 film by Stanley Kubrick"]) == pytest.approx(8 / 9)
    # best answer counts: vs "Mercury (planet)" [mercury, planet] 2/3, vs "Mercury" 1
    assert R.f1("Mercury", ["Mercury (planet)", "Mercury"]) == 1.0
    # repeated tokens count once each: common min(2, 1) = 1, P = 1/2, R = 1, F1 = 2/3
    assert R.f1("paris paris", ["Paris"]) == pytest.approx(2 / 3)
    # no common token
    assert R.f1("Lyon", ["Paris"]) == 0.0
    # empty after normalisation on either side
    assert R.f1("the", ["a"]) == 0.0 and R.f1("", ["Paris"]) == 0.0 and R.f1("Paris", [""]) == 0.0
    assert R.f1("Paris", []) == 0.0
    # a plain string is one answer
    assert R.f1("Paris", "Paris") == 1.0


def test_exact_match_by_hand():
    assert R.exact_match("The Mercury.", ["mercury"]) == 1.0  # "mercury" == "mercury"
    assert R.exact_match("Mercury planet", ["Mercury (planet)", "Venus"]) == 1.0  # "mercury planet" both
    assert R.exact_match("Stanley Kubrick", ["Kubrick"]) == 0.0
    assert R.exact_match("the", ["a"]) == 0.0  # both empty: no match (EM never above F1)
    assert R.exact_match("", [""]) == 0.0


# ----------------------------------------------------------------------------------------------------
# extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I looked it up.\nAnswer: Paris", "Paris"),
        ("Answer: Lyon\nthen I checked\nanswer: **Paris**.", "Paris"),  # the last one, any case, decorations
        ("**Answer**: Carl Weber", "Carl Weber"),
        ("The final answer: 42", "42"),
        ("Answer:\n\nCarl Weber\nmore", "Carl Weber"),  # empty answer line: the next non-empty line
        ("Answer: Paris, France (the capital)\nextra", "Paris, France (the capital)"),
        ("<think>Answer: wrong</think>Answer: right", "right"),
        ("reasoning without an opening tag</think>\nAnswer: X", "X"),
        ("<think>unclosed thought\nAnswer: kept", "kept"),
        # the tool call's "Answer:" is not read; the end period is stripped
        ('<tool_call>{"name": "search", "arguments": {"query": "Answer: no"}}</tool_call>\nI will search.',
         "I will search"),
        ("<tool_call>{\"name\": \"visit\"", ""),  # a truncated call is no answer
        ("<answer>Ada Byron</answer>", "Ada Byron"),
        ("<answer>first</answer> text <answer> second </answer>", "second"),
        ("<answer>Answer: Paris</answer>", "Paris"),
        ("Line one\n\nLine two  \n\n", "Line two"),
        ("The answer is Paris", "The answer is Paris"),  # no "Answer:": the last line
        ("", ""),
        ("Answer:", ""),
    ],
)
def test_extract_answer(text, expected):
    assert R.extract_answer(text) == expected


def test_score_extracts_first():
    # "Answer: Stanley Kubrick" -> "Stanley Kubrick" vs "Kubrick": F1 2/3, EM 0
    assert R.score("blah\nAnswer: Stanley Kubrick", ["Kubrick"]) == pytest.approx(2 / 3)
    assert R.score("blah\nAnswer: Stanley Kubrick", ["Kubrick"], metric="em") == 0.0
    assert R.score("Answer: kubrick", ["Kubrick"], metric="em") == 1.0
    with pytest.raises(ValueError, match="unknown metric"):
        R.score("x", ["x"], metric="bleu")


# ----------------------------------------------------------------------------------------------------
# entry points


def test_scorer_roles():
    gt = json.dumps(["Carl Weber"])
    assert R.scorer("main", "Answer: Carl Weber", gt) == 1.0
    # sub report "Weber": pred [weber], gold [carl, weber]: P = 1, R = 1/2, F1 = 2/3
    assert R.scorer("sub", "He was born in 1786.\nAnswer: Weber", gt) == pytest.approx(2 / 3)
    assert R.em_scorer("sub", "He was born in 1786.\nAnswer: Weber", gt) == 0.0
    assert R.em_scorer("main", "Answer: carl weber.", gt) == 1.0
    assert R.scorer("main", "Answer: Weber", "Carl Weber") == pytest.approx(2 / 3)  # plain-string ground truth
    with pytest.raises(ValueError, match="role"):
        R.scorer("judge", "x", gt)
    assert relay.load_scorer("mgrpo_verl.envs.research.rewards:scorer") is R.scorer
    assert relay.load_scorer("mgrpo_verl.envs.research.rewards:em_scorer") is R.em_scorer


def test_compute_score_dict():
    gt = json.dumps(["Kubrick"])
    result = R.compute_score("mgrpo_verl/research/wiki_multihop", "Answer: Stanley Kubrick", gt)
    assert result == pytest.approx({"score": 2 / 3, "acc": 0.0, "f1": 2 / 3, "em": 0.0})
    result = R.compute_score("mgrpo_verl/research/gaia", "Answer: Kubrick", gt, extra_info={"index": 0})
    assert result == {"score": 1.0, "acc": 1.0, "f1": 1.0, "em": 1.0}


@pytest.mark.parametrize("source", ["mgrpo_verl/relay", "mgrpo_verl/researcher", "gsm8k", ""])
def test_compute_score_rejects_other_sources(source):
    with pytest.raises(ValueError, match="mgrpo_verl/research"):
        R.compute_score(source, "Answer: x", "x")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(max_size=40), max_size=3))
def test_metric_properties(prediction, answers):
    f = R.f1(prediction, answers)
    em = R.exact_match(prediction, answers)
    assert 0.0 <= f <= 1.0 and em in (0.0, 1.0)
    assert em <= f


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_a_normalisable_answer_matches_itself(text):
    if R.normalize_answer(text):
        assert R.f1(text, [text]) == 1.0 and R.exact_match(text, [text]) == 1.0


# ----------------------------------------------------------------------------------------------------
# LLM judge against a fake OpenAI-compatible server


class FakeServer:
    """A chat-completions endpoint on 127.0.0.1: replies ``reply`` (or HTTP ``status`` when not 200) and
    records the requests it got."""

    def __init__(self) -> None:
        self.reply = "CORRECT"
        self.status = 200
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if fake.status != 200:
                    payload = b'{"error": "boom"}'
                    self.send_response(fake.status)
                else:
                    message = {"role": "assistant", "content": fake.reply}
                    payload = json.dumps({"choices": [{"message": message}]}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeServer()
    yield fake
    fake.close()


def make_judge(server, **kw) -> R.LLMJudge:
    return R.LLMJudge(R.JudgeConfig(server.base_url, "judge-model", timeout_s=5, retry_backoff_s=0.0, **kw))


def test_judge_correct_and_incorrect(server, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    judge = make_judge(server, api_key_env="MY_JUDGE_KEY")
    assert judge.judge("Who composed it?", "Weber", ["Carl Weber"]) == 1.0
    request = server.requests[-1]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["body"]["model"] == "judge-model"
    prompt = request["body"]["messages"][-1]["content"]
    assert "Who composed it?" in prompt and "Carl Weber" in prompt and "Weber" in prompt
    server.reply = "INCORRECT"
    assert judge.judge("", "Mozart", ["Carl Weber"]) == 0.0
    assert "not shown" in server.requests[-1]["body"]["messages"][-1]["content"]
    server.reply = " correct.\n"  # case, spaces and one final period are tolerated
    assert judge.judge("q", "Weber", ["Carl Weber"]) == 1.0
    # an empty prediction is wrong without asking
    count = len(server.requests)
    assert judge.judge("q", "  ", ["Carl Weber"]) == 0.0 and len(server.requests) == count


@pytest.mark.parametrize("reply", ["Maybe", "CORRECT, because it matches", "", "INCORRECT!"])
def test_judge_garbage_reply_raises(server, reply):
    server.reply = reply
    with pytest.raises(R.JudgeError, match="replied " + re.escape(repr(reply))):
        make_judge(server).judge("q", "Weber", ["Carl Weber"])
    assert len(server.requests) == 1  # a reply is not retried


def test_judge_http_500_raises_after_retries(server):
    server.status = 500
    with pytest.raises(R.JudgeError, match="after 3 attempt"):
        make_judge(server, max_retries=2).judge("q", "Weber", ["Carl Weber"])
    assert len(server.requests) == 3  # 1 + 2 retries


def test_judge_http_400_is_not_retried(server):
    server.status = 400
    with pytest.raises(R.JudgeError, match="HTTP 400"):
        make_judge(server, max_retries=2).judge("q", "Weber", ["Carl Weber"])
    assert len(server.requests) == 1


def test_judge_unreachable_raises():
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens on that port any more
    judge = R.LLMJudge(R.JudgeConfig(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, retry_backoff_s=0.0))
    with pytest.raises(R.JudgeError, match="after 2 attempt"):
        judge.judge("q", "a", ["a"])


def test_judge_missing_env_vars(monkeypatch):
    for name in (R.ENV_BASE_URL, R.ENV_MODEL, R.ENV_API_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="MGRPO_JUDGE_BASE_URL"):
        R.judge_scorer_from_env()
    monkeypatch.setenv(R.ENV_BASE_URL, "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="MGRPO_JUDGE_MODEL"):
        R.judge_scorer("main", "Answer: x", '["x"]')
    monkeypatch.setenv(R.ENV_MODEL, "m")
    monkeypatch.setenv(R.ENV_API_KEY_ENV, "MGRPO_TEST_UNSET_KEY")
    monkeypatch.delenv("MGRPO_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="MGRPO_TEST_UNSET_KEY"):
        R.judge_scorer_from_env()


def test_judge_scorer_from_env(server, monkeypatch):
    monkeypatch.setenv(R.ENV_BASE_URL, server.base_url)
    monkeypatch.setenv(R.ENV_MODEL, "judge-model")
    monkeypatch.delenv(R.ENV_API_KEY_ENV, raising=False)
    gt = json.dumps(["Carl Weber"])
    assert relay.load_scorer("mgrpo_verl.envs.research.rewards:judge_scorer") is R.judge_scorer
    assert R.judge_scorer("main", "Thinking...\nAnswer: Weber", gt) == 1.0
    sent = server.requests[-1]["body"]["messages"][-1]["content"]
    assert "Predicted answer: Weber" in sent and "Carl Weber" in sent and server.requests[-1]["auth"] is None
    # a sub-agent's report is scored by F1, without the judge: "Weber" vs "Carl Weber" = 2/3
    count = len(server.requests)
    assert R.judge_scorer("sub", "Answer: Weber", gt) == pytest.approx(2 / 3) and len(server.requests) == count
    server.status = 500  # no silent fallback to F1 (the default backoff's pauses skipped)
    monkeypatch.setattr(R.time, "sleep", lambda seconds: None)
    with pytest.raises(R.JudgeError):
        R.judge_scorer("main", "Answer: Weber", gt)


# ----------------------------------------------------------------------------------------------------
# adversarial replies: linear time (the lazy <think>.*?</think> pattern rescanned the rest of the text
# from every unclosed tag: 16,000 tags took 8.5 s, 50,000 took 89 s)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("n", [16_000, 50_000])
def test_many_unclosed_tags_are_stripped_in_linear_time(n):
    from mgrpo_verl.envs.research.rewards import extract_answer, strip_reasoning

    assert strip_reasoning("<think>" * n + "Answer: Paris") == "Answer: Paris"  # stray tags dropped, text kept
    assert extract_answer("<think>" * n + "Answer: Paris") == "Paris"
    assert extract_answer("<answer>" * n + "Paris") == "Paris"  # no closed block: the last line
    assert extract_answer("x</think>" * n + "Answer: Rome") == "Rome"  # after the last stray closing tag
    assert extract_answer("<think>a</think>" * n + "<answer>Oslo</answer>") == "Oslo"


def test_blocks_open_at_the_first_tag_and_close_at_the_next_closing_one():
    from mgrpo_verl.envs.research.rewards import strip_reasoning

    # as re's <think>.*?</think>: an inner <think> is text of the block; a stray </think> cuts what precedes
    assert strip_reasoning("a<think>b<think>c</think>d</think>e") == "e"
    assert strip_reasoning("a<think>b</think>c<THINK>d") == "acd"
