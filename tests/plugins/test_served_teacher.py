"""A language model served over HTTP as the teacher (served:MODEL), against the test kit's
OpenAI-compatible server on localhost: its logits equal the in-process prompted teacher's through
real runs' caches, a run stopped partway and run again asks each question once in total, a second
run asks nothing, the key is written nowhere, injected faults are retried, persistent ones end the
run with a message naming the endpoint, and layer methods are refused before any request."""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest
import torch

from kdplug.cli import main
from kdplug.registry import Registry
from kdplug.storage import building_under
from kdplug.testing.decoders import make_tiny_causal_lm
from kdplug.testing.openai_server import OpenAIServer
from kdplug.testing.tiny import TinyTask
from kdplug.types import Example

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

TEMPLATE = "Review: {text}\nSentiment:"
VERBALIZER = {"negative": " bad film", "positive": " good"}  # a label of several tokens
KEY = "sk-test-0123456789abcdef-never-written"
OTHER_KEY = "sk-test-another-key-never-written"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return make_tiny_causal_lm(tmp_path_factory.mktemp("served") / "gpt2", "gpt2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2")


def served(server, lm, *options):
    """The command line's served teacher of ``server``, with the prompt and ``options``."""
    argv = ["--teacher", f"served:{server.name}", "--set", f"teacher_options.base_url={server.base_url}"]
    argv += ["--set", f"teacher_options.tokenizer={lm}", *prompt_options()]
    for option in options:
        argv += ["--set", f"teacher_options.{option}"]
    return argv


def prompt_options():
    return [
        "--set",
        f"teacher_options.prompt={json.dumps(TEMPLATE)}",
        "--set",
        f"teacher_options.verbalizer={json.dumps(VERBALIZER)}",
        "--set",
        "teacher_options.calibrate=true",
    ]


def run_argv(data, tmp_path, name, cache):
    return [
        "run",
        "--student",
        "bilstm",
        "--projector",
        "rkd",
        "--task",
        "sst2",
        "--data-dir",
        str(data),
        "--epochs",
        "1",
        "--precision",
        "fp32",
        "--output",
        str(tmp_path / name),
        "--cache-dir",
        str(cache),
        "--set",
        "allow_weak_teacher=true",
        "--set",
        "measure_speed=false",
    ]


def cached_logits(run):
    """Each split's teacher logits as the run cached them."""
    metrics = json.loads((run / "metrics.json").read_text())
    cache = run.parent / "cache" / "teacher-cache"
    return {
        split: np.fromfile(cache / record["logits"]["key"] / "logits.f32", np.float32).reshape(-1, 2)
        for split, record in metrics["teacher"]["cache"].items()
    }


#: the distinct requests of one run: (train + dev + 3 content-free inputs) x 2 labels
REQUESTS = (len(SST2_TRAIN) + len(SST2_DEV) + 3) * 2


def test_served_logits_equal_the_prompted_teachers_and_a_second_run_asks_nothing(
    lm, data, tmp_path, monkeypatch, capsys
):
    """Through real runs' caches: the served teacher's logits equal prompted-lm's on the same model
    (1e-5); a second run, against another address with another key, sends no request (neither is part
    of a cache key); the keys, in the environment, are in no file any run wrote."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cache = tmp_path / "cache"
    argv = run_argv(data, tmp_path, "inprocess", cache)
    assert main([*argv, "--teacher", "prompted-lm", "--set", f"teacher_options.source={lm}", *prompt_options()]) == 0
    with OpenAIServer(lm, api_key=KEY) as server:  # answers only requests that bear the key
        assert main([*run_argv(data, tmp_path, "served", cache), *served(server, lm)]) == 0
        assert server.requests["completions"] == REQUESTS and set(server.answered.values()) == {1}
    monkeypatch.setenv("OPENAI_API_KEY", OTHER_KEY)
    with OpenAIServer(lm, api_key=OTHER_KEY) as other:  # another address and key: the same teacher, nothing asked
        assert main([*run_argv(data, tmp_path, "again", cache), *served(other, lm)]) == 0
        assert sum(other.requests.values()) == 0
    out = capsys.readouterr().out
    expected, got = cached_logits(tmp_path / "inprocess"), cached_logits(tmp_path / "served")
    assert set(got) == {"train", "dev"}
    for split in got:
        np.testing.assert_allclose(got[split], expected[split], rtol=0, atol=1e-5)
    record = json.loads((tmp_path / "served" / "metrics.json").read_text())["teacher"]["served"]
    assert record["scoring"] == "echo" and len(record["calibrate"]["p_cf"]) == 2
    # the run that computed nothing records what auto chose when its outputs were computed (was: "auto")
    again = json.loads((tmp_path / "again" / "metrics.json").read_text())["teacher"]["served"]
    assert again["scoring"] == "echo" and again["scoring_chosen"] == "auto"
    assert f"sends {REQUESTS} requests (0 already answered" in out
    assert f"sends 0 requests ({REQUESTS} already answered" in out
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any("served-answers" in str(path) for path in written)
    assert not [
        path for path in written if KEY.encode() in path.read_bytes() or OTHER_KEY.encode() in path.read_bytes()
    ]


def test_a_run_stopped_partway_and_run_again_asks_each_question_once(lm, data, tmp_path, capsys):
    """The server goes away after 10 answers: the run ends with exit 1 and a message naming the
    endpoint, no traceback; run again against a new server on the same port, it asks only the rest."""
    cache = tmp_path / "cache"
    first = OpenAIServer(lm).start()
    port, url, stopped = first.port, first.base_url, threading.Event()

    def stop_after(answers):
        while sum(first.answered.values()) < answers:
            time.sleep(0.002)
        first.stop()
        stopped.set()

    threading.Thread(target=stop_after, args=(10,), daemon=True).start()
    options = ("max_retries=1", "backoff=0", "concurrency=4")
    assert main([*run_argv(data, tmp_path, "first", cache), *served(first, lm, *options)]) == 1
    err = capsys.readouterr().err
    # the test server's own threads may print the requests it dropped when it stopped: no frame of kdplug's
    assert stopped.is_set() and not re.search(r'File ".*/(kdplug|kdplug_models)/(?!testing/)', err), err
    assert f"the served teacher's endpoint {url}/completions failed 2 times" in err
    err = " ".join(err.split())
    assert "run the same command again (the failed run's directory is replaced) to ask only for the rest" in err
    assert "--overwrite" not in err and "nothing to resume" not in err  # one piece of advice, and it works:
    with OpenAIServer(lm, port=port) as second:
        assert main([*run_argv(data, tmp_path, "first", cache), *served(second, lm, *options)]) == 0
    asked = first.answered + second.answered
    # each question answered once in total, but for those in flight when the server stopped: it counted
    # them as it sent them, and the connection it cut never delivered them (at most concurrency=4)
    again = [question for question, times in asked.items() if times > 1]
    assert len(asked) == REQUESTS and max(asked.values()) <= 2 and len(again) <= 4, asked
    assert 10 <= sum(first.answered.values()) < REQUESTS


@pytest.fixture(scope="module")
def server(lm):
    with OpenAIServer(lm) as running:
        yield running


def served_model(server, lm, root, **options):
    """The served teacher built directly (no run), storing its answers under ``root``."""
    from kdplug.plugins import get_plugin_manager

    task = TinyTask(examples={"train": [Example("a fine film", 1)], "dev": [Example("a dull film", 0)]})
    with building_under(root):
        teacher = get_plugin_manager().registry.create(
            "teacher",
            f"served:{server.name}",
            task,
            base_url=server.base_url,
            tokenizer=lm,
            **{"prompt": TEMPLATE, "verbalizer": VERBALIZER, "backoff": 0.0, **options},
        )
    ids = torch.tensor([[ord(c) for c in teacher.encoder.render("a gripping story")]])
    return teacher, ids


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("429", {"retry_after": 0}),
        ("500", {}),
        ("503", {}),
        ("timeout", {"seconds": 1.0}),
        ("malformed", {}),
        ("drop", {}),
    ],
)
def test_each_injected_fault_is_retried(server, lm, tmp_path, kind, params):
    """One fault, then the answer: the teacher's logits are those of a fault-free server."""
    teacher, ids = served_model(server, lm, tmp_path / "clean")
    expected = teacher.model(ids, torch.ones_like(ids)).logits
    teacher, ids = served_model(server, lm, tmp_path / "faulty", timeout=0.3, concurrency=1)
    server.fail_next(kind, **params)
    torch.testing.assert_close(teacher.model(ids, torch.ones_like(ids)).logits, expected, rtol=0, atol=0)
    assert server.faults_pending == 0


def test_persistent_failure_names_the_endpoint_and_the_status(server, lm, data, tmp_path, capsys):
    """A request that fails on every try: exit 1, a message naming the endpoint and the status, no traceback."""
    server.fail_next("500", count=3)  # the first request, on each of its 3 tries
    options = ("max_retries=2", "backoff=0", "concurrency=1")
    assert main([*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm, *options)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and server.faults_pending == 0
    assert (
        f"the served teacher's endpoint {server.base_url}/completions failed 3 times; the last answer: HTTP 500" in err
    )


@pytest.mark.parametrize("projector", ["pkd-skip", "tinybert", "cka"])
def test_layer_methods_are_refused_before_any_request(lm, data, tmp_path, capsys, projector):
    with OpenAIServer(lm) as fresh:
        argv = run_argv(data, tmp_path, "run", tmp_path / "cache")
        argv[argv.index("rkd")] = projector
        assert main([*argv, *served(fresh, lm)]) == 2
        assert sum(fresh.requests.values()) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    assert f"teacher 'served:{fresh.name}' gives kdplug only its label log-probabilities, never its layers" in err
    assert f"projector {projector!r}" in err


def test_the_dry_run_counts_requests_tokens_and_cost(server, lm, data, tmp_path, capsys):
    before = sum(server.requests.values())
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm, "price_per_million_tokens=2.5")]
    assert main([*argv, "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert sum(server.requests.values()) == before  # a dry run sends nothing
    assert f"sends {REQUESTS} requests (0 already answered in the cache) and about" in out
    tokens = int(out.split("and about ")[1].split()[0])
    assert tokens > REQUESTS and f"about {round(tokens / 1e6 * 2.5, 6):g} at the given price" in out
    assert "a transfer set adds its own" in out


def test_the_dry_run_counts_the_transfer_sets_requests_and_their_cost_too(server, lm, data, tmp_path, capsys):
    """The transfer set is where the requests are (20 copies an example by default): its count, an upper
    bound (duplicates are dropped when it is built), was left out of the dry run's count and cost."""
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm, "price_per_million_tokens=2.5")]
    assert main([*argv, "--augment", "tang", "--set", "augment_factor=3", "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    transfer = len(SST2_TRAIN) * 3 * 2  # three copies of each training example, two labels each
    assert f"its transfer set at most {transfer} requests and about" in out
    base = int(out.split("and about ")[1].split()[0])
    more = int(out.split(f"at most {transfer} requests and about ")[1].split()[0])
    assert more > transfer and f"about {round((base + more) / 1e6 * 2.5, 6):g} at the given price in all" in out


def test_a_served_teacher_without_base_url_is_a_usage_error(lm, data, tmp_path, capsys):
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), "--teacher", "served:gpt2", *prompt_options()]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "teacher served:gpt2 needs the server's address: --set teacher_options.base_url=http://HOST:PORT/v1" in err


def test_a_name_field_is_text_where_the_factory_takes_a_str():
    registry = Registry()

    def text(task, model: str):
        return model

    def number(task, layers: int):
        return layers

    registry.add("teacher", "served:{model}", text)
    registry.add("student", "bert-{layers}", number)
    assert registry.resolve("teacher", "served:meta-llama/Llama-3.1-70B-Instruct")[1] == {
        "model": "meta-llama/Llama-3.1-70B-Instruct"
    }
    assert registry.resolve("student", "bert-4")[1] == {"layers": 4}


def test_a_transfer_set_asks_for_its_own_examples_only(server, lm, data, tmp_path):
    """Logit methods with a transfer set work: the set's texts are asked for once each (two labels)."""
    transfer = tmp_path / "transfer.txt"
    transfer.write_text("what a film\na lifeless plot\nthe acting shines\n")
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm), "--transfer", str(transfer)]
    before = sum(server.answered.values())
    assert main(argv) == 0
    assert sum(server.answered.values()) - before == REQUESTS + 3 * 2


def test_an_answer_line_cut_short_by_a_kill_is_asked_again(server, lm, tmp_path):
    """The answer file's last line cut mid-way (as a kill leaves it): that answer alone is asked again."""
    teacher, ids = served_model(server, lm, tmp_path)
    expected = teacher.model(ids, torch.ones_like(ids)).logits
    (answers,) = tmp_path.glob("served-answers/*/answers.jsonl")
    lines = answers.read_bytes().splitlines(keepends=True)
    answers.write_bytes(b"".join(lines[:-1]) + lines[-1][:20])
    stored = len(lines)
    before = sum(server.answered.values())
    teacher, ids = served_model(server, lm, tmp_path)
    torch.testing.assert_close(teacher.model(ids, torch.ones_like(ids)).logits, expected, rtol=0, atol=0)
    assert sum(server.answered.values()) - before == 1
    # the damaged line was dropped (the file rewritten): it is skipped once, not on every later run
    lines = answers.read_bytes().splitlines(keepends=True)
    assert len(lines) == stored and all(json.loads(line)["k"] for line in lines), lines
    assert all(line.endswith(b"}\n") for line in lines)


def test_top_logprobs_scoring_reads_each_labels_first_token_with_a_stated_floor(server, lm, tmp_path):
    """Chat-only scoring: a label's score is its first token's log-probability among the chat answer's
    top 20 (as the completions endpoint scores that token after the same prompt), else the lowest returned."""
    from kdplug_models.served import TOP_K, echo_question
    from kdplug_models.served_client import ask_all

    # ' n' is among this prompt's top 20 for the tiny model (seed 0), ' g' (of ' good') is not: both cases
    teacher, _ = served_model(
        server, lm, tmp_path, scoring="top-logprobs", verbalizer={"negative": " n", "positive": " good"}
    )
    scorer = teacher.model.scorer
    assert scorer.first_tokens == (" n", " g")
    prompt = teacher.encoder.render("a gripping story")
    (top,) = ask_all(scorer.endpoint, scorer.store, scorer.questions([prompt]), concurrency=1)
    assert len(top) == TOP_K
    first = [echo_question(server.name, prompt, token) for token in scorer.first_tokens]
    exact = ask_all(scorer.endpoint, scorer.store, first, concurrency=2)
    returned = dict(top)
    assert " n" in returned and " g" not in returned
    expected = [
        exact[j] if token in returned else min(returned.values()) for j, token in enumerate(scorer.first_tokens)
    ]
    torch.testing.assert_close(
        scorer.scores([prompt])[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-5
    )
    assert teacher.extra["served"]["scoring"] == "top-logprobs"


def test_a_run_killed_mid_pass_and_run_again_asks_only_what_it_had_not_stored(lm, data, tmp_path):
    """kdplug itself SIGKILLed after 10 answers (whatever it was writing): the run again asks only what
    it had not stored."""
    import os
    import signal
    import subprocess
    import sys

    cache = tmp_path / "cache"
    with OpenAIServer(lm) as server:
        argv = [*run_argv(data, tmp_path, "killed", cache), *served(server, lm, "concurrency=2")]
        child = subprocess.Popen([sys.executable, "-m", "kdplug.cli", *argv], env=dict(os.environ))
        deadline = time.monotonic() + 60
        while sum(server.answered.values()) < 10 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        killed_after = sum(server.answered.values())
        assert main([*run_argv(data, tmp_path, "again", cache), *served(server, lm)]) == 0
    assert 10 <= killed_after < REQUESTS
    # every answer stored before the kill is reused; only those in flight at the kill (2 at most: its
    # concurrency), answered by the server but never received or stored, are asked again
    twice = [prompt for prompt, count in server.answered.items() if count > 1]
    assert len(server.answered) == REQUESTS and max(server.answered.values()) <= 2 and len(twice) <= 2, twice


def test_a_key_given_as_api_key_env_is_refused_without_being_repeated(server, lm, tmp_path):
    from kdplug.errors import UsageError

    with pytest.raises(UsageError, match="names the environment variable that holds the API key") as refused:
        served_model(server, lm, tmp_path, api_key_env=KEY)
    assert KEY not in str(refused.value)


def test_sigint_during_the_pass_stops_asking_stores_what_was_in_flight_and_exits_130(lm, data, tmp_path):
    """SIGINT after 6 answers of a slow server: no request is started after it, those in flight are
    answered and stored, the run exits 130; run again, it asks only the rest, each question once in all."""
    import os
    import signal
    import subprocess
    import sys

    cache = tmp_path / "cache"
    with OpenAIServer(lm) as server:
        server.fail_next("timeout", count=REQUESTS, seconds=0.05)  # each answer held 50 ms
        argv = [*run_argv(data, tmp_path, "stopped", cache), *served(server, lm, "concurrency=2")]
        child = subprocess.Popen([sys.executable, "-m", "kdplug.cli", *argv], env=dict(os.environ))
        deadline = time.monotonic() + 60
        while sum(server.answered.values()) < 6 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 130
        stopped_after = sum(server.answered.values())
        while server.faults_pending:  # the rest answered at once
            server._faults.take()
        assert main([*run_argv(data, tmp_path, "again", cache), *served(server, lm)]) == 0
    assert 6 <= stopped_after <= 6 + 2 + 2  # the two in flight at the signal, and two started meanwhile at most
    assert len(server.answered) == REQUESTS and set(server.answered.values()) == {1}


class EmptyTopLogprobs(OpenAIServer):
    """The test server, its next ``empty`` chat answers with ``"top_logprobs": []``."""

    empty = 0

    def answer(self, endpoint, body):
        response, prompt = super().answer(endpoint, body)
        if endpoint == "chat/completions" and self.empty:
            self.empty -= 1
            response["choices"][0]["logprobs"]["content"][0]["top_logprobs"] = []
        return response, prompt


def test_an_answer_without_top_logprobs_is_retried_and_never_stored(lm, tmp_path):
    """An empty top_logprobs is a failed try: retried (then the logits are the clean server's), and
    where every try gets one, a ServedError names the endpoint and nothing is stored."""
    from kdplug_models.served_client import ServedError

    options = {"scoring": "top-logprobs", "verbalizer": {"negative": " n", "positive": " good"}, "max_retries": 1}
    with EmptyTopLogprobs(lm) as server:
        teacher, ids = served_model(server, lm, tmp_path / "clean", **options)
        expected = teacher.model(ids, torch.ones_like(ids)).logits
        server.empty = 1
        teacher, ids = served_model(server, lm, tmp_path / "once", **options)
        torch.testing.assert_close(teacher.model(ids, torch.ones_like(ids)).logits, expected, rtol=0, atol=0)
        server.empty = 2
        teacher, ids = served_model(server, lm, tmp_path / "always", **options)
        with pytest.raises(ServedError, match=f"endpoint {server.base_url}/chat/completions failed 2 times") as failed:
            teacher.model(ids, torch.ones_like(ids))
        assert "HTTP 200 without what kdplug reads" in str(failed.value)
        assert not list((tmp_path / "always").glob("served-answers/*/answers.jsonl"))
        # run again: asked again (nothing bad was stored), and answered
        teacher, ids = served_model(server, lm, tmp_path / "always", **options)
        torch.testing.assert_close(teacher.model(ids, torch.ones_like(ids)).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999/v1", "with a port from 1 to 65535"),
        ("http://127.0.0.1:abc/v1", "with a port from 1 to 65535"),
        ("http://user:s3cretpass@127.0.0.1:8000/v1", "holds a user name or password"),
    ],
)
def test_a_base_url_with_a_bad_port_or_credentials_is_a_usage_error(lm, data, tmp_path, capsys, url, said):
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), "--teacher", "served:gpt2", *prompt_options()]
    argv += ["--set", f"teacher_options.base_url={url}", "--set", f"teacher_options.tokenizer={lm}"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and said in err and "s3cretpass" not in err
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and b"s3cretpass" in path.read_bytes()]


def test_an_unset_api_key_env_is_refused_before_the_run_without_being_repeated(lm, data, tmp_path, capsys):
    """api_key_env set to a variable that is not set (here a key pasted as its name): exit 2 before
    the run directory is made, the name in no message and no file."""
    canary = "sk_SECRETcanary123"
    with OpenAIServer(lm) as fresh:
        argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(fresh, lm, f"api_key_env={canary}")]
        assert main(argv) == 2
        assert sum(fresh.requests.values()) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the environment variable teacher_options.api_key_env names is not set" in err and canary not in err
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and canary.encode() in path.read_bytes()]


def test_a_refused_key_names_the_variable_read_and_whether_it_was_set(lm, tmp_path, monkeypatch):
    from kdplug_models.served_client import ServedError

    monkeypatch.setenv("MY_SERVER_KEY", OTHER_KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIServer(lm, api_key=KEY) as guarded:
        for variable, said in (("MY_SERVER_KEY", "(set)"), ("OPENAI_API_KEY", "(not set: no key was sent)")):
            teacher, ids = served_model(guarded, lm, tmp_path / variable, api_key_env=variable)
            with pytest.raises(ServedError, match="answered HTTP 401") as refused:
                teacher.model(ids, torch.ones_like(ids))
            message = str(refused.value)
            assert f"read from the environment variable {variable} {said}" in message and OTHER_KEY not in message


def test_a_timeout_beyond_a_day_is_a_usage_error(server, lm, data, tmp_path, capsys):
    before = sum(server.requests.values())
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm, "timeout=1e300")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and "timeout" in err and "at most 86400" in err
    assert sum(server.requests.values()) == before


def test_the_plan_counts_the_prompts_cut_to_max_length_as_the_run_sends_them(server, lm, data, tmp_path, capsys):
    """Texts cut to max_length=4: after a run, the dry run of the same counts every request as answered."""
    argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), *served(server, lm), "--set", "max_length=4"]
    assert main(argv) == 0
    assert main([*argv, "--dry-run", "--overwrite"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"sends {REQUESTS} requests (0 already answered" in out
    assert f"sends 0 requests ({REQUESTS} already answered" in out


def test_an_augmenter_that_reads_the_teachers_weights_is_refused_before_any_request(lm, data, tmp_path, capsys):
    """teacher-words reads the teacher's word embeddings, which a served teacher keeps on its server: it
    crashed with an AttributeError after the teacher was checked; now exit 2 before the run directory."""
    with OpenAIServer(lm) as fresh:
        argv = [*run_argv(data, tmp_path, "run", tmp_path / "cache"), "--augment", "teacher-words"]
        assert main([*argv, *served(fresh, lm)]) == 2
        assert sum(fresh.requests.values()) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and "--augment teacher-words reads the teacher's own weights" in err
    assert "--transfer FILE" in err and not (tmp_path / "run").exists()


def test_a_served_teachers_run_shows_no_size_or_speed_of_its_own_and_gives_prompt_advice(
    server, lm, data, tmp_path, capsys, caplog
):
    """Its weights are the server's: the table says `served` (not 0.0K parameters), its speed is not timed
    (that would send requests; the student's speed-up is left blank), the student is not called as large
    as a 0-parameter teacher, the tip offers no augmenter that reads its weights, and a weak served teacher
    is given the prompted teacher's causes, not a checkpoint's (`finetuned=false`)."""
    argv = run_argv(data, tmp_path, "run", tmp_path / "cache")
    argv[argv.index("measure_speed=false")] = "measure_speed=true"
    assert main([*argv, *served(server, lm)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"teacher (served:{server.name})"))
    assert row.split()[2] == "served" and "MB" not in row
    student = next(line for line in out.splitlines() if line.startswith("bilstm + rkd"))
    assert "MB" in student and not student.rstrip().endswith("x")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["speed"]["teacher"] is None
    assert "as many as the teacher" not in caplog.text
    assert "--augment teacher-words" not in out and "--augment tang" in out

    one_class = write_sst2(tmp_path / "one-class", dev=[(text, 1) for text, _ in SST2_DEV * 3])  # unbeatable
    argv = run_argv(one_class, tmp_path, "weak", tmp_path / "cache")
    at = argv.index("allow_weak_teacher=true")
    del argv[at - 1 : at + 1]
    assert main([*argv, *served(server, lm)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "not worth distilling" in err and "the prompt or the verbalizer does not fit the model" in err
    assert "finetuned=false" not in err
