"""The chat page in a real browser: Debian's chromium, headless, driven by Selenium through the system chromedriver
(no driver download: SE_OFFLINE), against the real server with an API key and a small body cap. One browser and
one server for the module; each test starts from a new conversation.

The model is wired (conftest's ``wired_model``): its greedy reply to anything is REPLY, a calculator call in the
middle, so what the page shows is checked against our generate() (``inference.generate_tokens``) and the prompt the
server was given against the chat template's rendering of the conversation the page should have sent.

Skipped, with the reason, where no chromium is installed; CI installs it (.ci/run). The screenshot of
docs/serving.md: ``NANOCHAT_SCREENSHOT=docs/images/chat_page.png pytest tests/serving/test_page_browser.py``."""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver  # the dev extra: the module skips only where chromium is missing
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.wait import WebDriverWait

from nanochat_hf.inference import generate_tokens, parts_from_tokens
from nanochat_hf.tokenizer import train_tokenizer
from nanochat_hf.tokenizer.chat_format import (
    ASSISTANT_END,
    ASSISTANT_START,
    OUTPUT_END,
    PYTHON_END,
    PYTHON_START,
)

from .conftest import client_text, openai, save_model, until, wired_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium installed: apt-get install chromium chromium-driver (.ci/run installs them)",
    ),
    pytest.mark.slow,
]

KEY = "page-key"
NAME = "tiny-wired"  # --name
MAX_BYTES = 2000  # the server's body cap: a long message passes it
BEFORE, EXPRESSION, AFTER = "Let me work it out:", "12*7+3", " so the answer is 87."
REPLY = f"{BEFORE}<<{EXPRESSION}=87>>{AFTER}"  # the model's greedy reply, as the server writes it
SIZE = (960, 640)  # the page's viewport, and the screenshot


@pytest.fixture(scope="module")
def server(serve, tmp_path_factory):
    """The server, its batcher in the test's process (engine "thread": the test slows its model down and reads
    the prompts it is given, ``server.prompts``)."""
    tokenizer = train_tokenizer([BEFORE + EXPRESSION + AFTER, "What is 12*7+3?", "Hello! How are you?"] * 10, 320)
    special = tokenizer.convert_tokens_to_ids

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    chains = [
        [special(ASSISTANT_START), *ids(BEFORE), special(PYTHON_START), *ids(EXPRESSION), special(PYTHON_END)],
        [special(OUTPUT_END), *ids(AFTER), special(ASSISTANT_END)],  # the tool writes <|output_start|>87<|output_end|>
    ]
    model = wired_model(tokenizer, chains, sequence_len=256, logit=2.0)  # sampled at temperature 0.8: other replies
    folder = save_model(tmp_path_factory.mktemp("wired"), model, tokenizer)
    running = serve(
        folder, name=NAME, api_key=KEY, max_request_bytes=MAX_BYTES, max_batch=1, max_queue=1, engine="thread"
    )
    batcher, running.prompts = running.server.batcher, []
    submit = batcher.submit

    def recorded(job) -> None:
        running.prompts.append(list(job.prompt))
        submit(job)

    batcher.submit = recorded
    return running


@pytest.fixture(scope="module")
def browser(server):
    driver_path = shutil.which("chromedriver")
    assert driver_path, "chromium is installed but not its driver: apt-get install chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root in a container
        "--disable-dev-shm-usage",
        "--disable-background-networking",
    ):
        options.add_argument(flag)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SE_OFFLINE", "true")  # Selenium Manager never downloads a driver or a browser
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:  # the page's viewport, exactly (a window's size includes the browser's own frame)
            metrics = {"width": SIZE[0], "height": SIZE[1], "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            driver.get(f"http://127.0.0.1:{server.port}/")
            yield driver
        finally:
            driver.quit()


def state(browser) -> dict:
    """What the page shows, read in one call."""
    return browser.execute_script(
        """const bubbles = [...document.querySelectorAll(".message.assistant")];
        const error = document.getElementById("error");
        return {busy: document.body.dataset.state === "busy",
                replies: bubbles.map((b) => b.dataset.text),
                turns: document.querySelectorAll(".message").length,
                error: error.hidden ? null : error.textContent,
                input: document.getElementById("input").value,
                model: document.getElementById("model").textContent,
                key_asked: !document.getElementById("key-bar").hidden};"""
    )


def wait(browser, condition, seconds: float = 60) -> dict:
    """The page's state once `condition(state)` holds."""

    def holds(driver) -> dict | None:
        now = state(driver)
        return now if condition(now) else None

    return WebDriverWait(browser, seconds, poll_frequency=0.02).until(holds)


def set_field(browser, field: str, value: str) -> None:
    element = browser.find_element(By.ID, field)
    element.clear()
    element.send_keys(value)


def send(browser, text: str, temperature: str = "0", top_k: str = "50") -> None:
    """Type a message and press Enter (a long one is pasted: typing it key by key would take seconds)."""
    set_field(browser, "temperature", temperature)
    set_field(browser, "top-k", top_k)
    box = browser.find_element(By.ID, "input")
    if len(text) > 100:
        browser.execute_script("arguments[0].value = arguments[1]", box, text)
    else:
        box.send_keys(text)
    box.send_keys(Keys.ENTER)


def ask(browser, text: str, **sampling) -> dict:
    """Send a message and wait for the page to be done with it; its state."""
    send(browser, text, **sampling)
    return wait(browser, lambda s: not s["busy"])


def new_chat(browser) -> None:
    """A new conversation, the key given if the page has none."""
    if state(browser)["key_asked"] or not state(browser)["model"]:
        set_field(browser, "key", KEY + Keys.ENTER)
        wait(browser, lambda s: s["model"] == NAME)
    browser.find_element(By.ID, "new").click()
    assert state(browser)["turns"] == 0


@contextmanager
def slowed(server, seconds: float = 0.15):
    """Every forward of the served model takes `seconds` longer while in it (a reply is still being written when the
    page is looked at); setting the Event it gives makes the next forward fail. Its ``go`` Event, once set, lets
    the forwards run at full speed again (the test has seen what it waited for)."""
    model, fail = server.server.batcher.model, threading.Event()
    fail.go = threading.Event()
    forward = model.forward

    def slow(*args, **kwargs):
        fail.go.wait(seconds)
        if fail.is_set():
            fail.clear()
            raise RuntimeError("a forward made to fail by the test")
        return forward(*args, **kwargs)

    model.forward = slow
    try:
        yield fail
    finally:
        del model.forward  # the class's forward again


def rendered(server, messages: list[dict]) -> list[int]:
    return server.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def reply_tokens(server, messages: list[dict]) -> list[int]:
    """Our generate()'s greedy reply, as long as the server lets it be (the page sends no max_tokens)."""
    prompt = rendered(server, messages)
    room = server.model.config.sequence_len - len(prompt)
    (tokens,) = generate_tokens(server.model, server.tokenizer, [prompt], room)
    return tokens


def test_the_page_asks_for_the_key_and_keeps_it_in_the_tab_only(browser, server):
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    refused = "Error 401: a valid API key is needed: send the header 'Authorization: Bearer KEY'"
    shown = wait(browser, lambda s: s["key_asked"] and s["error"])
    assert (shown["error"], shown["model"]) == (refused, "")
    ask(browser, "What is 12*7+3?")  # sent without a key: refused, the message back in the box
    shown = wait(browser, lambda s: s["error"])
    assert (shown["error"], shown["turns"], shown["input"], shown["key_asked"]) == (refused, 0, "What is 12*7+3?", True)
    set_field(browser, "key", "wrong" + Keys.ENTER)
    shown = wait(browser, lambda s: s["error"])
    assert (shown["error"], shown["key_asked"], shown["model"]) == (refused, True, "")
    set_field(browser, "key", KEY + Keys.ENTER)
    shown = wait(browser, lambda s: s["model"])
    assert (shown["model"], shown["key_asked"], shown["error"]) == (NAME, False, None)
    stored = browser.execute_script("return [sessionStorage.getItem('nanochat-api-key'), localStorage.length]")
    assert stored == [KEY, 0]
    assert ask(browser, "")["replies"] == [REPLY]  # Enter sends what the box still held, now with the key
    browser.refresh()  # the tab keeps the key
    assert wait(browser, lambda s: s["model"])["key_asked"] is False


def test_a_greedy_reply_is_generate_s_text_with_the_calculator_shown(browser, server):
    new_chat(browser)
    question = [{"role": "user", "content": "What is 12*7+3?"}]
    shown = ask(browser, "What is 12*7+3?", temperature="0")
    tokens = reply_tokens(server, question)
    assert client_text(server.tokenizer, tokens) == REPLY  # generate()'s text, as a client must read it
    assert (shown["replies"], shown["error"]) == ([REPLY], None)
    assert parts_from_tokens(server.tokenizer, tokens) == [
        {"type": "text", "text": BEFORE},
        {"type": "python", "text": EXPRESSION},
        {"type": "python_output", "text": "87"},
        {"type": "text", "text": AFTER},
    ]  # what the page was sent is generate()'s reply: text, call, result, text
    assert server.prompts[-1] == rendered(server, question)
    bubble = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
    texts = browser.execute_script(
        "return [...arguments[0].childNodes].filter((n) => n.nodeType === 3).map((n) => n.data)", bubble
    )
    call = bubble.find_element(By.CLASS_NAME, "call")
    shown_call = [call.find_element(By.CLASS_NAME, c).text for c in ("tool", "expr", "result")]
    assert (texts, shown_call) == ([BEFORE, AFTER], ["CALCULATOR", EXPRESSION, "= 87"])


def test_a_second_turn_carries_the_first(browser, server):
    new_chat(browser)
    first, second = "What is 12*7+3?", "And twice that?"
    ask(browser, first, temperature="0")
    shown = ask(browser, second, temperature="1", top_k="1")  # top-k 1: greedy, though sampled
    asked = [{"role": "user", "content": first}]
    reply = parts_from_tokens(server.tokenizer, reply_tokens(server, asked))
    conversation = [*asked, {"role": "assistant", "content": reply}, {"role": "user", "content": second}]
    # the first reply goes back as the model wrote it: its calculator call as python parts, not as "<<...>>" text
    assert server.prompts[-1] == rendered(server, conversation)
    assert shown["replies"] == [REPLY, server.reference(conversation, max_tokens=64)] == [REPLY, REPLY]
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "messages")).perform()  # off the buttons
    screenshot = browser.get_screenshot_as_png()
    assert screenshot[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", screenshot[16:24]) == SIZE
    if target := os.environ.get("NANOCHAT_SCREENSHOT"):
        Path(target).write_bytes(screenshot)
    origin = f"http://127.0.0.1:{server.port}/"
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert fetched and all(url.startswith(origin) for url in fetched)  # nothing from anywhere else


def test_refusals_are_one_line_and_the_page_goes_on(browser, server):
    new_chat(browser)
    long = "word " * (MAX_BYTES // 5)
    shown = ask(browser, long)
    refused = f"the request body is larger than this server takes ({MAX_BYTES} bytes, --max-request-bytes)"
    assert (shown["error"], shown["turns"], shown["input"]) == (f"Error 413: {refused}", 0, long.strip())
    browser.find_element(By.ID, "input").clear()
    shown = ask(browser, "What is 12*7+3?", temperature="5")
    assert shown["error"] == "Error 400: temperature must be a number from 0.0 to 2.0, got 5"
    shown = ask(browser, "", temperature="0")  # the message was put back: Enter sends it again
    assert (shown["error"], shown["replies"], shown["input"]) == (None, [REPLY], "")


def test_stop_ends_the_reply_mid_way_and_the_page_goes_on(browser, server):
    new_chat(browser)
    batcher = server.server.batcher
    with slowed(server):  # 21 steps: about 3 s for the whole reply
        send(browser, "Hello!")
        grown = [len(wait(browser, lambda s: s["replies"] and s["replies"][-1])["replies"][-1])]
        grown.append(len(wait(browser, lambda s: len(s["replies"][-1]) > grown[0])["replies"][-1]))
        browser.find_element(By.ID, "stop").click()
        stopped = wait(browser, lambda s: not s["busy"])["replies"][-1]
        until(lambda: not batcher.active and not batcher.waiting)  # the server dropped it
        time.sleep(0.5)
        assert state(browser)["replies"] == [stopped]  # no longer growing
    assert 0 < grown[0] < grown[1] <= len(stopped) < len(REPLY) and REPLY.startswith(stopped)  # streamed, then cut
    assert browser.find_element(By.CSS_SELECTOR, ".message.assistant + .note").text == "stopped"
    shown = ask(browser, "Go on.")
    assert (shown["replies"], shown["error"]) == ([stopped, REPLY], None)


def test_a_failure_mid_reply_is_one_line_and_the_reply_so_far_stays(browser, server):
    new_chat(browser)
    with slowed(server) as fail:
        send(browser, "Hello!")
        wait(browser, lambda s: s["replies"] and s["replies"][-1])
        fail.set()
        shown = wait(browser, lambda s: not s["busy"])
    so_far = shown["replies"][-1]
    assert shown["error"] == "Error 500: generation failed (the server's log says why)"
    assert 0 < len(so_far) < len(REPLY) and REPLY.startswith(so_far)
    shown = ask(browser, "Go on.")
    assert (shown["replies"], shown["error"]) == ([so_far, REPLY], None)


def test_a_busy_server_s_429_is_one_line(browser, server):
    new_chat(browser)
    batcher, question = server.server.batcher, [{"role": "user", "content": "Hi"}]
    client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)
    # one request decoded (max_batch 1), one waiting (max_queue 1); 1 s a forward, so both are still there when the
    # page's request arrives on a loaded machine (at 0.15 s the first could finish first: a queued reply, not a 429);
    # once the page has its answer, the two go on at full speed
    with slowed(server, 1.0) as slow, ThreadPoolExecutor(2) as pool:
        held = [pool.submit(client.chat.completions.create, model=NAME, messages=question, max_tokens=6)]
        until(lambda: batcher.active)
        held.append(pool.submit(client.chat.completions.create, model=NAME, messages=question, max_tokens=6))
        until(lambda: batcher.waiting)
        shown = ask(browser, "What is 12*7+3?")
        slow.go.set()
        assert [f.result().usage.completion_tokens for f in held] == [6, 6]
    assert (shown["error"], shown["turns"], shown["input"]) == (
        "Error 429: the server is busy (its queue of 1 is full): try again later",
        0,
        "What is 12*7+3?",
    )
    assert ask(browser, "")["replies"] == [REPLY]
