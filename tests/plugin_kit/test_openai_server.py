"""The test kit's OpenAI-compatible server (kdplug.testing.openai_server): a verbalizer's summed
``token_logprobs`` after a prompt equal the in-process prompted teacher's label log-probability, each
endpoint answers in the OpenAI shape, each injected fault is what a plain HTTP client sees, 32
requests at once are all answered and counted, a stopped server frees its port and drops its
connections, and the command line serves until SIGTERM (a bad model directory exits 2)."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import kdplug
from kdplug.testing.decoders import make_tiny_causal_lm, make_tiny_t5_config
from kdplug.testing.openai_model import messages_key
from kdplug.testing.openai_server import OpenAIServer, main
from kdplug.testing.tiny import TinyTask

TEMPLATE = "Review: {text}\nSentiment:"
VERBALIZER = {"negative": " bad", "positive": " good"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_causal_lm(tmp_path_factory.mktemp("served") / "tiny-gpt2", "gpt2")


@pytest.fixture(scope="module")
def server(model_dir):
    with OpenAIServer(model_dir) as server:
        yield server


def post(server, path, body, *, timeout=10, raw=None, headers=None):
    """``(status, headers, body)`` of one POST to ``server`` with a fresh connection; the body as
    JSON where it parses, else its bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = raw if raw is not None else json.dumps(body)
        connection.request("POST", f"/v1/{path}", data, {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        payload = response.read()
        try:
            payload = json.loads(payload)
        except ValueError:
            pass
        return response.status, dict(response.getheaders()), payload
    finally:
        connection.close()


def complete(server, prompt, timeout=10, **fields):
    body = {"model": server.name, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1, **fields}
    return post(server, "completions", body, timeout=timeout)


def label_log_prob(server, prompt, verbalizer):
    """The verbalizer's joint log-probability after ``prompt``, as a served teacher reads it."""
    status, _, body = complete(server, prompt + verbalizer)
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    return sum(
        value for value, offset in zip(logprobs["token_logprobs"], logprobs["text_offset"]) if offset >= len(prompt)
    )


def test_verbalizer_log_probs_equal_the_prompted_teachers(server, model_dir):
    task = TinyTask()
    teacher = kdplug.create_teacher("prompted-lm", task, source=model_dir, prompt=TEMPLATE, verbalizer=VERBALIZER)
    model = teacher.model.eval()
    assert max(teacher.extra["prompted"]["verbalizer_tokens"].values()) > 1  # several tokens to sum
    texts = [example.text_a for example in task.load_split("dev")]
    encoded = teacher.encoder(texts)["input_ids"]
    width = max(map(len, encoded))
    ids = torch.tensor([[0] * (width - len(row)) + row for row in encoded])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in encoded])
    with torch.no_grad():
        expected, _ = model.label_log_probs(ids, mask)
    served = [[label_log_prob(server, teacher.encoder.render(text), v) for v in VERBALIZER.values()] for text in texts]
    torch.testing.assert_close(torch.tensor(served, dtype=torch.float64), expected.double(), rtol=0, atol=1e-5)


def test_models_lists_the_served_name(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request("GET", "/v1/models")
    response = connection.getresponse()
    assert response.status == 200
    assert json.loads(response.read()) == {
        "object": "list",
        "data": [{"id": "tiny-gpt2", "object": "model", "owned_by": "kdplug-test"}],
    }
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"


def test_echo_scores_the_prompt_and_greedy_tokens_follow(server, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "Review: a good film\nSentiment:"
    status, _, body = complete(server, prompt, max_tokens=3, logprobs=2)
    assert status == 200 and body["object"] == "text_completion" and body["model"] == "tiny-gpt2"
    choice, usage = body["choices"][0], body["usage"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        greedy = lm.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False, min_new_tokens=3)[0].tolist()
        log_probs = lm(torch.tensor([greedy])).logits[0].log_softmax(-1)
    generated = tokenizer.decode(greedy[len(ids) :])
    assert choice["text"] == prompt + generated and choice["finish_reason"] == "length"
    assert usage == {"prompt_tokens": len(ids), "completion_tokens": 3, "total_tokens": len(ids) + 3}
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = [float(log_probs[i - 1, greedy[i]]) for i in range(1, len(greedy))]
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-5)
    assert logprobs["tokens"] == [tokenizer.decode([token]) for token in greedy]
    # offsets: the prompt's tokens where the tokenizer puts them, the generated ones after the prompt
    offsets = [start for start, _ in tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]]
    tail = [len(prompt) + len("".join(logprobs["tokens"][len(ids) : len(ids) + n])) for n in range(3)]
    assert logprobs["text_offset"] == offsets + tail
    for token, value, top in zip(logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert top[token] == value and 2 <= len(top) <= 3  # the two most probable and the token itself
    # the generated tokens are the most probable: their own entry is the largest
    assert all(max(top.values()) == top[t] for t, top in zip(logprobs["tokens"][-3:], logprobs["top_logprobs"][-3:]))
    # without echo: only what was generated, offsets into that text; without logprobs: none
    status, _, plain = complete(server, prompt, max_tokens=3, echo=False, logprobs=None)
    assert status == 200 and plain["choices"][0]["text"] == generated and plain["choices"][0]["logprobs"] is None
    status, _, alone = complete(server, prompt, max_tokens=3, echo=False, logprobs=0)
    assert alone["choices"][0]["logprobs"]["text_offset"] == [n - len(prompt) for n in tail]


def test_chat_answers_the_generated_tokens_with_top_logprobs(server, model_dir, tmp_path):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Say the sentiment."}, {"role": "user", "content": "a good film"}]
    body = {"model": server.name, "messages": messages, "max_tokens": 2, "logprobs": True, "top_logprobs": 4}
    status, _, answer = post(server, "chat/completions", body)
    assert status == 200 and answer["object"] == "chat.completion", answer
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 2 and choice["message"] == {
        "role": "assistant",
        "content": "".join(t["token"] for t in content),
    }
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 4 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == entry["logprob"]  # greedy
        assert entry["bytes"] == list(entry["token"].encode())
    # no chat template: the contents joined by newlines
    joined = AutoTokenizer.from_pretrained(model_dir)("Say the sentiment.\na good film")["input_ids"]
    assert answer["usage"]["prompt_tokens"] == len(joined)
    assert server.answered[messages_key(messages)] >= 1
    # a chat template: the messages as it writes them, the assistant's turn opened
    templated = make_tiny_causal_lm(tmp_path / "chat", "gpt2", chat_template=CHAT_TEMPLATE)
    with OpenAIServer(templated) as chat_server:
        status, _, answer = post(chat_server, "chat/completions", {**body, "model": "chat"})
    written = "<|system|>Say the sentiment.\n<|user|>a good film\n<|assistant|>"
    assert status == 200 and answer["usage"]["prompt_tokens"] == len(
        AutoTokenizer.from_pretrained(templated)(written)["input_ids"]
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "named"),
    [
        ("completions", {"model": "tiny-gpt2", "prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ("completions", {"model": "tiny-gpt2", "prompt": ["a", "b"]}, 400, "prompt"),
        ("completions", {"model": "tiny-gpt2", "prompt": "a", "logprobs": 99}, 400, "logprobs"),
        ("completions", {"prompt": "a"}, 400, "model"),
        ("completions", {"model": "tiny-gpt2", "prompt": "a", "stream": True}, 400, "stream"),
        ("completions", {"model": "tiny-gpt2", "prompt": "a", "n": 2}, 400, "'n'"),
        ("completions", {"model": "gpt-4o", "prompt": "a"}, 404, "gpt-4o"),
        ("chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "bot", "content": "a"}]}, 400, "role"),
        ("chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
         400, "logprobs"),
        ("embeddings", {"model": "tiny-gpt2", "input": "a"}, 404, "/v1/embeddings"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_error_bodies(server, path, body, status, named):
    answered = sum(server.answered.values())
    got, _, answer = post(server, path, body)
    assert got == status and answer["error"]["code"] == status and named in answer["error"]["message"]
    assert sum(server.answered.values()) == answered


def test_a_body_that_is_not_json_or_has_no_length_is_refused(server):
    status, _, answer = post(server, "completions", None, raw=b"{'model': ")
    assert status == 400 and "not valid JSON" in answer["error"]["message"]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    # headers alone: the server answers on them, and a body sent after its answer met a closed socket (EPIPE)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 400 and "Content-Length" in json.loads(response.read())["error"]["message"]


def test_a_key_is_required_when_given(model_dir):
    with OpenAIServer(model_dir, name="keyed", api_key="sk-test") as server:
        body = {"model": "keyed", "prompt": "a good film", "max_tokens": 0, "echo": True, "logprobs": 0}
        assert post(server, "completions", body)[0] == 401
        assert post(server, "completions", body, headers={"Authorization": "Bearer sk-other"})[0] == 401
        status, _, answer = post(server, "completions", body, headers={"Authorization": "Bearer sk-test"})
        assert status == 200 and answer["model"] == "keyed"
        assert server.requests["completions"] == 3 and dict(server.answered) == {"a good film": 1}


def test_each_fault_is_what_a_client_sees(server):
    prompt = "a nice film"
    before = server.answered[prompt]
    server.fail_next("429", retry_after=7)
    server.fail_next("500")
    server.fail_next("503")
    server.fail_next("malformed")
    server.fail_next("drop")
    status, headers, body = complete(server, prompt)
    assert status == 429 and headers["Retry-After"] == "7" and body["error"]["code"] == 429
    assert complete(server, prompt)[0] == 500 and complete(server, prompt)[0] == 503
    status, _, body = complete(server, prompt)
    assert status == 200 and isinstance(body, bytes)  # not JSON
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        complete(server, prompt)
    assert server.faults_pending == 0 and server.answered[prompt] == before
    # the faults were taken one per scoring request; the next one is answered
    assert complete(server, prompt)[0] == 200 and server.answered[prompt] == before + 1


def test_a_timeout_holds_the_request(server):
    prompt = "the acting was awful"
    server.fail_next("timeout", count=2, seconds=0.4)
    with pytest.raises(TimeoutError):
        complete(server, prompt, timeout=0.1)  # the client gives up: the server does not answer it
    started = time.monotonic()
    assert complete(server, prompt, timeout=10)[0] == 200  # a patient client gets its answer, late
    assert time.monotonic() - started >= 0.4
    time.sleep(0.3)  # the first hold is over by now
    assert server.answered[prompt] == 1


def test_a_fault_of_an_unknown_kind_is_refused(server):
    with pytest.raises(ValueError, match="unknown fault '404'"):
        server.fail_next("404")
    with pytest.raises(ValueError, match="takes seconds, not retry_after"):
        server.fail_next("timeout", retry_after=1)


def test_32_requests_at_once_are_all_answered_and_counted(server):
    prompts = [f"Review: film number {n}\nSentiment: good" for n in range(32)]
    alone = {prompt: complete(server, prompt)[2]["choices"] for prompt in prompts[:4]}
    counted, answered = server.requests["completions"], server.answered.copy()
    barrier, results = threading.Barrier(32), {}

    def ask(prompt):
        barrier.wait()
        results[prompt] = complete(server, prompt)

    threads = [threading.Thread(target=ask, args=(prompt,)) for prompt in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(status == 200 for status, _, _ in results.values())
    assert all(results[prompt][2]["choices"] == choices for prompt, choices in alone.items())
    assert server.requests["completions"] == counted + 32
    assert server.answered - answered == dict.fromkeys(prompts, 1)


def test_a_stopped_server_drops_its_connections_and_frees_its_port(model_dir):
    first = OpenAIServer(model_dir).start()
    port = first.port
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    kept.request("GET", "/v1/models")
    assert kept.getresponse().read()  # a kept-alive connection, as an HTTP client's pool holds
    first.stop()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        kept.request("GET", "/v1/models")
        kept.getresponse()
    with OpenAIServer(model_dir, port=port) as second:
        assert second.port == port and complete(second, "a nice film")[0] == 200
        assert second.requests["completions"] == 1 and first.requests["completions"] == 0
    assert first.port == port
    with first:  # started again: on its port
        assert complete(first, "a nice film")[0] == 200 and first.answered["a nice film"] == 1


def test_the_command_line_serves_until_sigterm(model_dir):
    command = [sys.executable, "-m", "kdplug.testing.openai_server", "--model", model_dir, "--port", "0"]
    command += ["--name", "teacher"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving teacher at http://127.0.0.1:"), (line, process.stderr.read())
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/v1/models")
        assert json.loads(connection.getresponse().read())["data"][0]["id"] == "teacher"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("kind", ["missing", "no config", "encoder-decoder"])
def test_a_bad_model_directory_exits_2(tmp_path, capsys, kind):
    directory = tmp_path / "model"
    if kind == "no config":
        directory.mkdir()
    elif kind == "encoder-decoder":
        make_tiny_t5_config(directory)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a job a shell started in the background
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(directory), "--port", "0"])
    message = capsys.readouterr().err
    assert exited.value.code == 2 and str(directory) in message and "causal LM" in message
    assert "Traceback" not in message
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back


def test_a_port_in_use_exits_2(server, model_dir, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--model", model_dir, "--port", str(server.port)])
    assert exited.value.code == 2 and f"{server.port}" in capsys.readouterr().err
