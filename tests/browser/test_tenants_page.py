"""The fair queue's panel in Chromium: ``minicb serve --replicas 2 --tenant ...`` on the
tiny random model; the page shows each tenant's band, queued and dispatched requests and
its refusals by reason, read from /fleet/tenants behind the key. Its screenshot goes to
artifacts/screenshots/tenants-page.png."""

import httpx

from tests.browser.conftest import js, next_frame, server, shot, wait_for

ADMIN, LIGHT, CAPPED = "admin-key", "light-key", "capped-key"
ROW = "document.querySelector('#tenants tr[data-tenant=\"{}\"]')"


def cells(page, tenant: str) -> list[str]:
    return js(page, f"[...{ROW.format(tenant)}.children].map(td => td.textContent)")


def test_the_page_shows_the_fair_queue_by_tenant(tab, tiny_llama_dir):
    args = ["serve", "--model", tiny_llama_dir, "--replicas", "2", "--router", "least-loaded"]
    args += ["--num-kv-blocks", "64", "--dtype", "float32", "--no-measure-utilisation"]
    args += ["--api-key", ADMIN, "--tenant", f"light:{LIGHT}:0", "--tenant", f"capped:{CAPPED}:1:1"]
    with server(*args) as url:
        page = tab
        page.goto(url + f"?key={ADMIN}")
        wait_for(page, ROW.format("light"))
        model = httpx.get(url + "v1/models", headers={"Authorization": f"Bearer {ADMIN}"})
        name = model.json()["data"][0]["id"]

        def post(key: str) -> int:
            body = {"model": name, "prompt": [5, 6, 7, 8], "max_tokens": 4}
            headers = {"Authorization": f"Bearer {key}"}
            reply = httpx.post(url + "v1/completions", json=body, headers=headers, timeout=60)
            return reply.status_code

        assert [post(LIGHT) for _ in range(3)] == [200, 200, 200]
        assert [post(CAPPED), post(CAPPED)] == [200, 429]  # 8 of a burst of 10, then 8 more
        wait_for(page, f"{ROW.format('capped')}.children[5].textContent === '1 over rate'")
        light = cells(page, "light")
        assert light[:3] == ["light", "0", "0"] and light[4] == "3"  # band 0, none queued
        capped = cells(page, "capped")
        assert capped[1] == "1" and capped[4] == "1" and capped[6] == "1"
        heading = js(page, "document.querySelector('#tenants h3').textContent")
        assert heading.startswith("Fair queue by tenant")
        assert "key" not in js(page, "document.querySelector('#tenants').textContent")
        next_frame(page)
        shot(page, "tenants-page")
        assert not page.errors
