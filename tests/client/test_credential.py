"""keyturn_client.Credential with a small hvac-like Vault of the test's own and a fake clock.

The Vault here answers `client.secrets.kv.v2.read_secret_version(...)` as hvac does (the
same answer shape, hvac's and requests' exceptions) from records the test publishes, and
counts every read. Time moves only when the test moves it; the few real waits are the
rejection polls (a fraction of a second) and reads held open to make callers overlap.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import hvac.exceptions
import pytest
import requests
import requests.adapters
from keyturn_client import Credential, CredentialUnavailable
from keyturn_client.httpx import KeyturnAuth as HttpxAuth
from keyturn_client.requests import KeyturnAuth as RequestsAuth

from keyturn.clock import FakeClock, rfc3339

PATH = "apps/billing/acme"
WHERE = f"secret/{PATH}"


class FakeVault:
    """KV v2 reads of one path, from the versions published so far."""

    def __init__(self) -> None:
        self.secrets = SimpleNamespace(kv=SimpleNamespace(v2=self))
        self.versions: list[tuple[dict[str, str], dict[str, str]]] = []
        self.reads: list[tuple[str, str]] = []  # (mount_point, path) of every read
        self.failure: Exception | None = None
        self.gate: threading.Event | None = None  # set: reads wait until it is set
        self.read_seconds = 0.0  # how long each read takes (real time, in the reading thread)
        self.publish_on_read: dict[int, dict[str, str]] = {}  # read number -> record to publish
        self._lock = threading.Lock()

    def publish(self, data: dict[str, str], custom: dict[str, str] | None = None) -> int:
        with self._lock:
            self.versions.append((dict(data), dict(custom or {})))
            return len(self.versions)

    def read_secret_version(
        self,
        path: str,
        version: int | None = None,
        mount_point: str = "secret",
        raise_on_deleted_version: bool | None = None,
    ) -> dict[str, Any]:
        assert raise_on_deleted_version is True  # hvac warns otherwise
        with self._lock:
            self.reads.append((mount_point, path))
            count = len(self.reads)
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if self.read_seconds:
            time.sleep(self.read_seconds)
        if count in self.publish_on_read:
            self.publish(self.publish_on_read.pop(count))
        if self.failure is not None:
            raise self.failure
        with self._lock:
            if not self.versions:
                raise hvac.exceptions.InvalidPath(None, method="GET", url=f"/v1/{path}")
            data, custom = self.versions[-1]
            number = len(self.versions)
        return {
            "data": {
                "data": dict(data),
                "metadata": {"version": number, "custom_metadata": dict(custom) or None},
            }
        }


def oauth(
    clock: FakeClock,
    token: str,
    *,
    lifetime: float = 100,
    refresh_in: float | None = None,
) -> dict[str, str]:
    now = clock.time()
    data = {
        "access_token": token,
        "token_type": "Bearer",
        "expires_at": rfc3339(now + lifetime),
        "issued_at": rfc3339(now),
        "authorization": f"Bearer {token}",
    }
    if refresh_in is not None:
        data["refresh_at"] = rfc3339(now + refresh_in)
    return data


def api_key(clock: FakeClock, key: str, *, rotate_in: float) -> dict[str, str]:
    now = clock.time()
    return {
        "api_key": key,
        "key_id": "key_1",
        "created_at": rfc3339(now),
        "rotate_after": rfc3339(now + rotate_in),
        "authorization": f"Bearer {key}",
    }


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def vault() -> FakeVault:
    return FakeVault()


@pytest.fixture
def make(vault: FakeVault, clock: FakeClock) -> Callable[..., Credential]:
    def build(**options: Any) -> Credential:
        return Credential(PATH, client=vault, clock=clock.time, **options)

    return build


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


# -- the caching rule ------------------------------------------------------------------------------


def test_the_value_is_cached_until_refresh_at_then_read_again(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=100, refresh_in=60))
    credential = make()
    assert credential.authorization == "Bearer at_one"
    assert credential.value == "at_one"
    assert vault.reads == [("secret", PATH)]
    for _ in range(47):
        clock.advance(1.25)
        assert credential.authorization == "Bearer at_one"
    assert len(vault.reads) == 1  # 58.75 s of use, one read
    vault.publish(oauth(clock, "at_two", lifetime=100, refresh_in=60))
    clock.advance(1.25)  # refresh_at
    assert credential.authorization == "Bearer at_two"
    assert credential.value == "at_two"
    assert credential.version == 2
    assert len(vault.reads) == 2


def test_the_times_are_read_from_the_data_not_the_custom_metadata(vault, clock, make) -> None:
    """keyturn's custom metadata holds no times (since 0.2.0): a `refresh_at` there is not
    what plans the next read; the data's `expires_at` (less the margin) does."""
    data = oauth(clock, "at_one", lifetime=100)
    vault.publish(data, {"managed-by": "keyturn", "refresh_at": rfc3339(clock.time() + 30)})
    credential = make(margin=5)
    assert credential.value == "at_one"
    clock.advance(30)
    assert credential.value == "at_one"
    assert len(vault.reads) == 1
    clock.advance(64.75)
    assert credential.value == "at_one"
    assert len(vault.reads) == 1
    clock.advance(0.25)
    assert credential.value == "at_one"
    assert len(vault.reads) == 2


def test_without_refresh_at_it_is_read_again_a_margin_before_expires_at(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=100))
    credential = make(margin=10)
    assert credential.value == "at_one"
    clock.advance(89.75)
    assert credential.value == "at_one"
    assert len(vault.reads) == 1
    clock.advance(0.25)
    assert credential.value == "at_one"
    assert len(vault.reads) == 2


def test_a_margin_longer_than_the_life_left_reads_again_half_way(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=6))
    credential = make(margin=60)
    assert credential.value == "at_one"
    clock.advance(2.75)
    assert credential.value == "at_one"
    assert len(vault.reads) == 1
    clock.advance(0.25)
    assert credential.value == "at_one"
    assert len(vault.reads) == 2


def test_refresh_at_later_than_expires_at_is_capped_by_it(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=10, refresh_in=50))
    credential = make()
    assert credential.value == "at_one"
    clock.advance(9.75)
    assert credential.value == "at_one"
    assert len(vault.reads) == 1
    vault.publish(oauth(clock, "at_two", lifetime=10))
    clock.advance(0.25)
    assert credential.value == "at_two"


def test_an_api_key_is_cached_until_rotate_after(vault, clock, make) -> None:
    vault.publish(api_key(clock, "ktsb_key_one", rotate_in=1000))
    credential = make()
    assert credential.value == "ktsb_key_one"
    assert credential.authorization == "Bearer ktsb_key_one"
    assert credential.expires_at is None
    clock.advance(999)
    assert credential.value == "ktsb_key_one"
    assert len(vault.reads) == 1
    vault.publish(api_key(clock, "ktsb_key_two", rotate_in=1000))
    clock.advance(1)
    assert credential.value == "ktsb_key_two"
    assert len(vault.reads) == 2


def test_a_late_keyturn_is_read_again_with_growing_pauses_bounded_by_the_life_left(
    vault, clock, make
) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=100, refresh_in=60))
    credential = make(min_interval=1)
    start = clock.time()
    read_at: list[float] = []
    while clock.time() - start < 99.875:
        before = len(vault.reads)
        assert credential.value == "at_one"
        if len(vault.reads) > before:
            read_at.append(round(clock.time() - start, 6))
        clock.advance(0.125)
    assert read_at[:6] == [0, 60, 61, 63, 67, 75]  # doubling from min_interval ...
    for at, gap in zip(read_at[5:], gaps(read_at[5:]), strict=False):
        # ... never longer than a quarter of what the value has left (at least min_interval)
        assert gap <= max(1.0, (100 - at) / 4) + 0.125
    assert len(read_at) < 20
    clock.advance(100 - (clock.time() - start))
    with pytest.raises(CredentialUnavailable) as caught:
        _ = credential.value
    assert "keyturn has not published a new one" in str(caught.value)
    assert caught.value.path == WHERE


def test_a_replacement_published_just_before_expiry_is_served_at_expiry(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=10))
    credential = make(min_interval=8)
    assert credential.value == "at_one"
    clock.advance(5)  # half-way: read again, nothing new yet
    assert credential.value == "at_one"
    assert len(vault.reads) == 2
    clock.advance(2)
    vault.publish(oauth(clock, "at_two", lifetime=10))
    clock.advance(3)  # expires_at, before min_interval has passed since the last read
    assert credential.value == "at_two"
    assert len(vault.reads) == 3


def test_refresh_forces_a_read_and_says_whether_the_value_changed(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    assert credential.value == "at_one"
    assert credential.refresh() is False
    assert len(vault.reads) == 2
    vault.publish(oauth(clock, "at_two", refresh_in=60))
    assert credential.refresh() is True
    assert credential.value == "at_two"
    assert len(vault.reads) == 3  # the forced read counts; the value is fresh until refresh_at


async def test_refresh_async_reads_in_a_thread(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    assert await credential.value_async() == "at_one"
    vault.publish(oauth(clock, "at_two", refresh_in=60))
    assert await credential.refresh_async() is True
    assert await credential.authorization_async() == "Bearer at_two"


# -- outages and bad records -----------------------------------------------------------------------


def test_a_vault_outage_serves_the_value_held_until_it_expires_then_names_the_path(
    vault, clock, make
) -> None:
    vault.publish(oauth(clock, "at_secret_one", lifetime=60, refresh_in=40))
    credential = make()
    assert credential.value == "at_secret_one"
    outage = requests.ConnectionError("connection refused")
    vault.failure = outage
    start = clock.time()
    while clock.time() - start < 59.875:
        clock.advance(0.125)
        assert credential.authorization == "Bearer at_secret_one"
    attempts = len(vault.reads) - 1
    assert 5 <= attempts <= 16  # it kept trying, with pauses, not on each of the 480 uses
    clock.advance(0.125)  # expires_at
    with pytest.raises(CredentialUnavailable) as caught:
        _ = credential.authorization
    error = caught.value
    assert error.path == WHERE
    assert WHERE in str(error)
    assert "expired at" in str(error)
    assert "cannot be reached" in str(error)
    assert error.__cause__ is outage
    for text in (str(error), repr(error), repr(error.args), error.reason):
        assert "at_secret_one" not in text
    # Vault answers again with keyturn's new value: picked up at the next planned read.
    vault.failure = None
    vault.publish(oauth(clock, "at_secret_two", lifetime=60, refresh_in=40))
    clock.advance(15)
    assert credential.value == "at_secret_two"


def test_vault_refusing_the_app_is_named(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=10))
    credential = make()
    assert credential.value == "at_one"
    vault.failure = hvac.exceptions.Forbidden("permission denied", method="GET", url="/v1/x")
    clock.advance(10)
    with pytest.raises(CredentialUnavailable, match=r"Vault refused the read \(403"):
        _ = credential.value


def test_nothing_published_is_a_clear_error_and_is_not_read_on_every_use(
    vault, clock, make
) -> None:
    credential = make(min_interval=2)
    with pytest.raises(CredentialUnavailable, match="nothing is published there") as caught:
        _ = credential.value
    assert caught.value.path == WHERE
    with pytest.raises(CredentialUnavailable):
        _ = credential.authorization
    assert len(vault.reads) == 1
    vault.publish(oauth(clock, "at_one"))
    clock.advance(2)
    assert credential.value == "at_one"


def test_an_expired_value_in_vault_is_never_handed_out(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_old", lifetime=5))
    clock.advance(6)
    credential = make()
    with pytest.raises(CredentialUnavailable, match="has not published a new one") as caught:
        _ = credential.value
    assert "at_old" not in str(caught.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"authorization": None}, "authorization"),
        ({"expires_at": "next tuesday"}, "expires_at"),
        ({"expires_at": "2030-01-01T00:00:00"}, "expires_at"),
        ({"refresh_at": "soon"}, "refresh_at"),
        ({"access_token": None}, "neither access_token nor api_key"),
    ],
)
def test_a_malformed_record_names_the_field_and_never_the_value(
    vault, clock, make, change, field
) -> None:
    data: dict[str, Any] = oauth(clock, "at_secret_value", lifetime=60)
    for name, value in change.items():
        if value is None:
            data.pop(name)
        else:
            data[name] = value
    vault.publish(data)
    with pytest.raises(CredentialUnavailable) as caught:
        _ = make().value
    assert field in str(caught.value)
    assert "at_secret_value" not in str(caught.value)
    assert caught.value.__cause__ is None  # nothing that could carry the record along


def test_a_malformed_new_version_keeps_the_value_held(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=60, refresh_in=30))
    credential = make()
    assert credential.value == "at_one"
    vault.publish({"note": "written by hand"})
    clock.advance(59)
    assert credential.value == "at_one"
    clock.advance(1)
    with pytest.raises(CredentialUnavailable, match="reading Vault failed: the record's field"):
        _ = credential.value


def test_repr_shows_the_path_and_the_version_only(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_secret_value"))
    credential = make()
    assert repr(credential) == "Credential(path='secret/apps/billing/acme', version=None)"
    _ = credential.value
    assert repr(credential) == "Credential(path='secret/apps/billing/acme', version=1)"
    assert str(credential) == repr(credential)
    assert "at_secret_value" not in repr(vars(credential)["_entry"])


def test_mount_and_path_are_read_as_given(vault, clock) -> None:
    vault.publish(oauth(clock, "at_one"))
    credential = Credential("/team/app/", mount="kv/", client=vault, clock=clock.time)
    assert credential.value == "at_one"
    assert vault.reads == [("kv", "team/app")]
    assert credential.path == "kv/team/app"


@pytest.mark.parametrize(
    "options",
    [{"margin": -1}, {"rejection_wait": -0.5}, {"min_interval": 0}],
)
def test_nonsense_options_are_refused(vault, clock, options) -> None:
    with pytest.raises(ValueError):
        Credential(PATH, client=vault, clock=clock.time, **options)
    with pytest.raises(ValueError, match="path"):
        Credential("/", client=vault, clock=clock.time)


# -- threads and coroutines ------------------------------------------------------------------------


@pytest.fixture
def gate(vault: FakeVault) -> Iterator[threading.Event]:
    vault.gate = threading.Event()
    yield vault.gate
    vault.gate.set()


def test_threads_that_need_a_first_value_share_one_read(vault, clock, make, gate) -> None:
    vault.publish(oauth(clock, "at_one"))
    credential = make()
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(credential.authorization)) for _ in range(16)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # every thread is in, one of them inside the read
    gate.set()
    for thread in threads:
        thread.join(5)
    assert got == ["Bearer at_one"] * 16
    assert len(vault.reads) == 1


def test_while_one_thread_reads_again_the_others_keep_the_valid_value(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=100, refresh_in=60))
    credential = make()
    assert credential.value == "at_one"
    vault.publish(oauth(clock, "at_two", lifetime=100, refresh_in=60))
    clock.advance(60)
    vault.gate = threading.Event()
    reader: list[str] = []
    thread = threading.Thread(target=lambda: reader.append(credential.value))
    thread.start()
    while len(vault.reads) < 2:
        time.sleep(0.01)
    # No waiting on Vault: the read is held at the gate until after these calls.
    assert [credential.value for _ in range(20)] == ["at_one"] * 20
    assert len(vault.reads) == 2 and thread.is_alive()
    vault.gate.set()
    thread.join(5)
    assert reader == ["at_two"]
    assert credential.value == "at_two"
    assert len(vault.reads) == 2


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (what asyncio.to_thread runs on), counting what it runs."""

    def __init__(self) -> None:
        super().__init__(max_workers=16)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
async def executor() -> CountingExecutor:
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    return executor


async def test_async_callers_share_one_read_in_a_thread_and_the_loop_keeps_running(
    vault, clock, make, executor
) -> None:
    vault.publish(oauth(clock, "at_one"))
    vault.read_seconds = 0.3
    credential = make()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    got = await asyncio.gather(*(credential.authorization_async() for _ in range(20)))
    ticking.cancel()
    assert got == ["Bearer at_one"] * 20
    assert len(vault.reads) == 1
    assert executor.submitted == 1  # one thread did the read; the others awaited it
    assert ticks >= 10  # the event loop ran while hvac blocked (in a thread)


async def test_async_callers_keep_the_valid_value_while_a_read_is_under_way(
    vault, clock, make
) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=100, refresh_in=60))
    credential = make()
    assert await credential.value_async() == "at_one"
    vault.publish(oauth(clock, "at_two", lifetime=100, refresh_in=60))
    clock.advance(60)
    vault.read_seconds = 0.3
    first = asyncio.create_task(credential.value_async())
    await asyncio.sleep(0.05)
    assert await credential.value_async() == "at_one"  # the held value, not the read's
    assert not first.done()  # answered while the read was still under way
    assert await first == "at_two"
    assert len(vault.reads) == 2


async def test_an_async_caller_gets_the_clear_error_after_expiry(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", lifetime=10))
    credential = make()
    assert await credential.value_async() == "at_one"
    vault.failure = hvac.exceptions.VaultDown("sealed", method="GET", url="/v1/x")
    clock.advance(10)
    with pytest.raises(CredentialUnavailable, match="Vault is sealed or down"):
        await credential.authorization_async()


# -- a value the service refused -------------------------------------------------------------------


def test_a_refused_value_already_replaced_is_not_read_again(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_two"))
    credential = make()
    assert credential.on_rejected("Bearer at_one") == "Bearer at_two"
    assert len(vault.reads) == 1  # the first read only


def test_a_refused_value_is_replaced_by_the_one_in_vault(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    sent = credential.authorization
    vault.publish(oauth(clock, "at_two", refresh_in=60))
    assert credential.on_rejected(sent) == "Bearer at_two"
    assert credential.authorization == "Bearer at_two"
    assert len(vault.reads) == 2


def test_a_refused_value_waits_for_keyturn_to_publish_its_replacement(vault, clock, make) -> None:
    # The provider revoked the token at refresh; keyturn publishes the new one a moment later.
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make(rejection_wait=1.0)
    sent = credential.authorization
    vault.publish_on_read[4] = oauth(clock, "at_two", refresh_in=60)
    assert credential.on_rejected(sent) == "Bearer at_two"
    assert len(vault.reads) == 4


def test_a_refused_value_with_no_replacement_waits_once_then_reads_at_most_per_interval(
    vault, clock, make
) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make(rejection_wait=0.3, min_interval=1)
    sent = credential.authorization
    started = time.monotonic()
    assert credential.on_rejected(sent) is None
    assert time.monotonic() - started >= 0.3
    assert len(vault.reads) == 1 + 1 + 3  # first read, the re-read, three polls
    # The same version: no second wait (each poll of a wait reads Vault) ...
    assert credential.on_rejected(sent) is None
    assert len(vault.reads) == 5  # ... and no read within min_interval
    clock.advance(1)
    assert credential.on_rejected(sent) is None
    assert len(vault.reads) == 6  # one read, no polls
    assert credential.authorization == sent  # still served: only the service can say more


def test_a_refused_value_while_vault_is_down_is_not_waited_for(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make(rejection_wait=5)
    sent = credential.authorization
    vault.failure = requests.ConnectionError("refused")
    assert credential.on_rejected(sent) is None
    assert len(vault.reads) == 2  # the first read and the failed re-read: no polls
    assert credential.authorization == sent


def test_threads_refused_together_share_the_re_read(vault, clock, make) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    sent = credential.authorization
    vault.publish_on_read[3] = oauth(clock, "at_two", refresh_in=60)
    got: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: got.append(credential.on_rejected(sent))) for _ in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert got == ["Bearer at_two"] * 12
    assert len(vault.reads) == 3


async def test_coroutines_refused_together_share_the_re_read(vault, clock, make, executor) -> None:
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    sent = await credential.authorization_async()
    vault.publish_on_read[3] = oauth(clock, "at_two", refresh_in=60)
    got = await asyncio.gather(*(credential.on_rejected_async(sent) for _ in range(12)))
    assert got == ["Bearer at_two"] * 12
    assert len(vault.reads) == 3
    assert executor.submitted == 2  # the first read, then one shared re-read


# -- the HTTP integrations: one retry with the new value -------------------------------------------


class Service:
    """A service that accepts only `Bearer <accepted>` and answers the rest 401, or 403
    `insufficient_scope` when told to; it records every Authorization header and body."""

    def __init__(self, accepted: str, *, refusal: tuple[int, str] | None = None) -> None:
        self.accepted = f"Bearer {accepted}"
        self.refusal = refusal or (401, 'Bearer error="invalid_token"')
        self.seen: list[tuple[str, bytes]] = []

    def answer(self, authorization: str, body: bytes) -> tuple[int, dict[str, str]]:
        self.seen.append((authorization, body))
        if authorization == self.accepted:
            return 200, {}
        status, challenge = self.refusal
        return status, {"WWW-Authenticate": challenge}

    def httpx_transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            status, headers = self.answer(request.headers["Authorization"], request.read())
            return httpx.Response(status, headers=headers, json={"ok": status == 200})

        return httpx.MockTransport(handle)

    def requests_adapter(self) -> requests.adapters.BaseAdapter:
        service = self

        class Adapter(requests.adapters.BaseAdapter):
            def send(self, request: requests.PreparedRequest, **_: Any) -> requests.Response:
                body = request.body
                if hasattr(body, "read"):
                    body = body.read()
                raw = body.encode() if isinstance(body, str) else (body or b"")
                status, headers = service.answer(str(request.headers["Authorization"]), raw)
                response = requests.Response()
                response.status_code = status
                response.headers.update(headers)
                response.raw = io.BytesIO(b"{}")
                response.request = request
                response.url = str(request.url)
                response.connection = self
                return response

            def close(self) -> None:
                pass

        return Adapter()


def refreshed_after_first_use(vault: FakeVault, clock: FakeClock, make) -> Credential:
    """A credential that has sent `at_one`, which keyturn has since replaced by `at_two`."""
    vault.publish(oauth(clock, "at_one", refresh_in=60))
    credential = make()
    assert credential.authorization == "Bearer at_one"
    vault.publish(oauth(clock, "at_two", refresh_in=60))
    return credential


def test_httpx_retries_a_refused_call_once_with_the_new_value(vault, clock, make) -> None:
    service = Service("at_two")
    credential = refreshed_after_first_use(vault, clock, make)
    auth = HttpxAuth(credential)
    with httpx.Client(transport=service.httpx_transport(), auth=auth) as client:
        answer = client.post("https://service.test/v1/projects", content=b"payload")
    assert answer.status_code == 200
    assert [r.status_code for r in answer.history] == [401]
    assert service.seen == [("Bearer at_one", b"payload"), ("Bearer at_two", b"payload")]


async def test_async_httpx_retries_a_refused_call_once_with_the_new_value(
    vault, clock, make
) -> None:
    service = Service("at_two")
    credential = refreshed_after_first_use(vault, clock, make)
    auth = HttpxAuth(credential)
    async with httpx.AsyncClient(transport=service.httpx_transport(), auth=auth) as client:
        answer = await client.post("https://service.test/v1/projects", content=b"payload")
    assert answer.status_code == 200
    assert [r.status_code for r in answer.history] == [401]
    assert service.seen == [("Bearer at_one", b"payload"), ("Bearer at_two", b"payload")]


def test_requests_retries_a_refused_call_once_with_the_new_value(vault, clock, make) -> None:
    service = Service("at_two")
    credential = refreshed_after_first_use(vault, clock, make)
    with requests.Session() as session:
        session.mount("https://service.test/", service.requests_adapter())
        session.auth = RequestsAuth(credential)
        answer = session.post("https://service.test/v1/projects", data=io.BytesIO(b"payload"))
    assert answer.status_code == 200
    assert [r.status_code for r in answer.history] == [401]
    assert service.seen == [("Bearer at_one", b"payload"), ("Bearer at_two", b"payload")]


def test_a_refusal_for_scope_is_returned_as_it_is(vault, clock, make) -> None:
    service = Service("at_two", refusal=(403, 'Bearer error="insufficient_scope"'))
    credential = refreshed_after_first_use(vault, clock, make)
    reads = len(vault.reads)
    with httpx.Client(transport=service.httpx_transport(), auth=HttpxAuth(credential)) as client:
        via_httpx = client.get("https://service.test/v1/projects")
    with requests.Session() as session:
        session.mount("https://service.test/", service.requests_adapter())
        session.auth = RequestsAuth(credential)
        via_requests = session.get("https://service.test/v1/projects")
    assert (via_httpx.status_code, via_requests.status_code) == (403, 403)
    assert via_httpx.history == [] and via_requests.history == []
    assert [authorization for authorization, _ in service.seen] == ["Bearer at_one"] * 2
    assert len(vault.reads) == reads  # a new value would lack the scope too: not read
