"""The chat page as HTTP sees it: served at / (no API key needed to load it; the API behind it still needs one),
one file that names no other origin, with a Content-Security-Policy that lets it fetch nothing from elsewhere;
``--no-page`` turns it off. What the page does in a browser: test_page_browser.py."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from nanochat_hf.serving.cli import main, parse_args

from .test_tool_and_bad_input import post

KEY = "page-key"


def get(server, path: str = "/", headers: dict | None = None) -> tuple[int, dict, str]:
    """(status, headers, body text) of a GET."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.fixture(scope="module")
def keyed(served, model_dir):
    return served(model_dir("g0"), api_key=KEY, engine="thread")


def test_the_page_is_served_at_root_without_the_key_the_api_still_needs_it(keyed):
    status, headers, page = get(keyed)
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert "<title>nanochat</title>" in page and 'fetch("/v1/chat/completions"' in page
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert post(keyed, None, "/v1/models")[0] == 401  # the page is open, the API behind it is not
    assert post(keyed, None, "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200


def test_the_page_names_no_other_origin(keyed):
    page = get(keyed)[2]
    assert re.findall(r"https?:|\b(?:src|href|action)\s*=|@import|url\(|<link|<img|<iframe", page) == []


def test_no_page_answers_404_at_root(served, model_dir):
    server = served(model_dir("g0"), no_page=True, api_key=KEY, engine="thread")
    key = {"Authorization": f"Bearer {KEY}"}
    assert post(server, None, "/")[0] == 401  # no page: / is guarded as any other path
    assert post(server, None, "/", key) == (
        404,
        {
            "error": {
                "message": "no such endpoint: this server serves /v1/chat/completions, /v1/models, /health",
                "type": "invalid_request_error",
                "code": 404,
            }
        },
    )
    assert post(server, None, "/v1/models", key)[0] == 200


def test_the_no_page_option(tmp_path, capsys):
    assert (parse_args([str(tmp_path)]).no_page, parse_args([str(tmp_path), "--no-page"]).no_page) == (False, True)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--no-page" in capsys.readouterr().out
