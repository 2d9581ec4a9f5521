"""cache_salt over HTTP: the cross-user probe through ``usage.prompt_tokens_details``.

User A sends a prompt; user B sends a guess that begins the same way and reads how many
of its tokens were cached (the review's probe, issue 54 L1). Requests with different
salts, or from different tenant keys, see none of each other's blocks; the same salt
shares them as an unsalted server always did. Tiny model, token-id prompts.
"""

from __future__ import annotations

import httpx
import pytest

from minicb.server.guard import Guard
from tests.api.conftest import tiny_engine
from tests.api.live import api_server


def _prompt(start: int) -> list[int]:
    """40 token ids of the tiny model's 256 (two full blocks of 16 can be cached), each
    test its own, so no test finds another's blocks."""
    return list(range(start, start + 40))


def _guess(prompt: list[int]) -> list[int]:
    return prompt[:32] + [7] * 8

KEY, TENANT_A, TENANT_B = "controller-key", "tenant-a-key", "tenant-b-key"


def _cached(url: str, prompt: list[int], salt: str | None = None, key: str = KEY) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"Authorization": f"Bearer {key}"}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    guard = Guard(api_key=KEY, tenant_keys=(TENANT_A, TENANT_B))
    with api_server(tiny_engine(tiny_llama_dir, block_size=16), "tiny", guard=guard) as live:
        yield live


def test_a_guess_with_another_salt_sees_no_cached_tokens_and_the_same_salt_does(server):
    prompt = _prompt(10)
    guess = _guess(prompt)
    assert _cached(server.url, prompt, "user-a") == 0
    assert _cached(server.url, guess, "user-b") == 0
    assert _cached(server.url, guess) == 0  # no salt: the shared cache holds none of A's
    assert _cached(server.url, guess, "user-a") == 32


def test_without_salts_the_cache_is_shared_as_before(server):
    prompt = _prompt(60)
    assert _cached(server.url, prompt) == 0
    assert _cached(server.url, _guess(prompt)) == 32


def test_each_tenant_key_salts_every_request_it_makes(server):
    prompt = _prompt(110)
    guess = _guess(prompt)
    assert _cached(server.url, prompt, key=TENANT_A) == 0
    assert _cached(server.url, guess, key=TENANT_B) == 0
    assert _cached(server.url, guess, key=KEY) == 0  # the controller, unsalted
    # A salt B chooses never reaches A's blocks: it is scoped by B's tenant.
    assert _cached(server.url, guess, "key:" + "0" * 32, key=TENANT_B) == 0
    assert _cached(server.url, guess, key=TENANT_A) == 32
    # A tenant's own salt splits its requests further, within its tenancy.
    assert _cached(server.url, prompt, "s", key=TENANT_A) == 0
    assert _cached(server.url, guess, "s", key=TENANT_A) == 32


def test_a_tenant_key_opens_v1_only(server):
    headers = {"Authorization": f"Bearer {TENANT_A}"}
    assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200
    assert httpx.get(server.url + "/metrics", headers=headers).status_code == 401
    wrong = {"Authorization": "Bearer nobody"}
    assert httpx.get(server.url + "/v1/models", headers=wrong).status_code == 401


def test_a_tenant_is_named_by_a_keyed_hash_never_the_key():
    guard = Guard(api_key=KEY, tenant_keys=(TENANT_A, TENANT_B))
    a, b = guard.tenant(TENANT_A), guard.tenant(TENANT_B)
    assert a.startswith("key:") and len(a) == 36 and TENANT_A not in a and a != b
    assert guard.tenant(TENANT_A) == a and guard.tenant(KEY) is None
    other = Guard(api_key=KEY, tenant_keys=(TENANT_A,))  # another server: another secret
    assert other.tenant(TENANT_A) != a
    with pytest.raises(ValueError, match="--tenant-key needs --api-key"):
        Guard(tenant_keys=("t",))
    with pytest.raises(ValueError, match="differ from the other keys"):
        Guard(api_key=KEY, tenant_keys=(KEY,))


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
@pytest.mark.parametrize("salt", ["", "x" * 201, 7])
def test_a_bad_salt_is_refused_by_name_on_both_endpoints(server, endpoint, salt):
    body = {"model": "tiny", "max_tokens": 2, "cache_salt": salt}
    body.update({"prompt": [1, 2]} if endpoint == "completions" else {"messages": []})
    r = httpx.post(
        f"{server.url}/v1/{endpoint}", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
