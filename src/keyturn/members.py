"""Several instances, one configuration: which instances are alive, and whose each credential is.

Each daemon beats into `<state_prefix>/_members` with check-and-set, to a takeover its tokens
can afford; one is gone when its beat counter stalls for that takeover (on the judge's own
monotonic clock). Shares go by rendezvous weight (`owner`); the per-credential lease still
guards every run. Why so: docs/architecture.md#several-instances.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace

from keyturn.clock import Clock
from keyturn.errors import KeyturnError, VaultCasConflict, VaultDataError
from keyturn.logs import get_logger
from keyturn.policy import RefreshPolicy, refresh_window
from keyturn.vault.store import KvEntry, KvStore

log = get_logger("keyturn.members")

RECORD = "_members"  # under the state prefix, beside the credentials' records
BEATS_PER_TAKEOVER = 3  # an instance beats this many times within its takeover
MIN_TAKEOVER = 3.0  # seconds: the least takeover (the configuration's minimum of takeover_after)
# A takeover needed by a token is this share of its slack: noticing a death takes up to the
# takeover and two beats (the last beat is seen at the judge's next one): 5/9 of the slack,
# which leaves 4/9 for the new owner's run (its read, the dead holder's lease, which is never
# longer than half of what the token has left, a token request, the publish).
SLACK_SHARE = 1 / 3
TAKEOVER_LOGGED = 0.1  # a change of the takeover by this share of it is logged (members.takeover)
WRITE_ATTEMPTS = 3  # check-and-set attempts per beat before the beat counts as failed
SKEW_WARNING = 2.0  # seconds between this host's clock and Vault's that are worth a warning
FORGET_AFTER = 3600.0  # a gone instance's entry is dropped this long after its last beat
SKEW_EVERY = 60.0  # seconds between reads made only to measure this host's clock against Vault's


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def members_path(state_prefix: str) -> str:
    return f"{state_prefix.strip('/')}/{RECORD}"


def weight(instance: str, credential: str) -> int:
    """The rendezvous weight of `instance` for `credential`: the same on every host."""
    digest = hashlib.blake2b(f"{instance}\0{credential}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(credential: str, instances: Iterable[str]) -> str | None:
    """The instance a credential belongs to among `instances` (None if there are none)."""
    return max(instances, key=lambda i: (weight(i, credential), i), default=None)


def slack(issued_at: float, expires_at: float, policy: RefreshPolicy) -> float:
    """Seconds from a token's latest planned refresh (`refresh_window`) to its expiry: how
    late its refresh may start, at worst, with apps still reading a valid token."""
    return expires_at - refresh_window(issued_at, expires_at, policy)[1]


def takeover_needed(tokens: Iterable[tuple[float, float, RefreshPolicy]]) -> float | None:
    """The takeover these tokens need, each given as (issued_at, expires_at, its credential's
    refresh policy): SLACK_SHARE of the smallest `slack`, never below MIN_TAKEOVER; None
    without tokens. For a 30 s token and the default policy the latest refresh is at the
    midpoint: a slack of 15 s, a takeover of 5 s.

    Only access tokens belong here. An API key's `expires_at` is the time it is due for
    rotation, not an expiry: a key whose rotation comes late (its owner died) still works,
    and its rotation's grace period keeps the old key working too, so a late takeover costs
    no read of a dead credential."""
    smallest = min((slack(*token) for token in tokens), default=None)
    return None if smallest is None else max(MIN_TAKEOVER, smallest * SLACK_SHARE)


def _seconds(value: object) -> float | None:
    """An advertised takeover or need: a positive, finite number of seconds, else None (an
    entry from an older keyturn has none; a value that is not one counts as none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


@dataclass(frozen=True, slots=True)
class Member:
    """One instance's entry in the record (no secrets: names, times and a counter)."""

    instance: str
    session: str  # random per process: tells a restart, or a namesake, from the same process
    host: str
    address: str | None  # its /metrics URL, for people
    pid: int
    started: float  # epoch seconds, its own clock
    beat: int  # moves at every beat: what "alive" is judged by
    beat_at: float  # epoch seconds of the last beat, its own clock
    skew: float | None = None  # its clock minus Vault's, as it last measured
    # The takeover (seconds) it beats to, a beat every third of it: it is judged gone once its
    # beat has not moved for this long (None: an older keyturn's entry, judged by the judge's
    # own takeover_after).
    takeover: float | None = None
    needs: float | None = None  # the takeover its own share's tokens need (None: no need known)

    def to_json(self) -> str:
        fields = asdict(self)
        del fields["instance"]  # the record's field name
        if fields["needs"] is None:
            del fields["needs"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, instance: str, text: str, path: str) -> Member:
        """Parse one field of the record; a malformed entry names the instance."""
        try:
            raw = json.loads(text)
            skew = raw.get("skew")
            return cls(
                instance=instance,
                session=str(raw["session"]),
                host=str(raw["host"]),
                address=None if raw.get("address") is None else str(raw["address"]),
                pid=int(raw["pid"]),
                started=float(raw["started"]),
                beat=int(raw["beat"]),
                beat_at=float(raw["beat_at"]),
                skew=None if skew is None else float(skew),
                takeover=_seconds(raw.get("takeover")),
                needs=_seconds(raw.get("needs")),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise VaultDataError(
                f"members record: the entry of instance {instance} is malformed "
                f"({type(exc).__name__})",
                path=path,
            ) from None


def gone_after(member: Member, takeover_after: float) -> float:
    """How long `member`'s beat may stand still before it is gone: the takeover it advertises
    (an older keyturn's entry advertises none: the judge's own `takeover_after`)."""
    if member.takeover is None:
        return takeover_after
    return max(MIN_TAKEOVER, member.takeover)


def read_members(entry: KvEntry | None, path: str) -> dict[str, Member]:
    """The record's entries by instance id ({} before any instance beat). A malformed entry
    is logged and left out (the next beat writes the record without it): one bad field must
    not stop every instance's heartbeat."""
    members = {}
    for name, text in (entry.data if entry is not None else {}).items():
        try:
            members[name] = Member.from_json(name, text, path)
        except VaultDataError as error:
            log.warning("members.entry_malformed", instance=name, error=str(error))
    return members


@dataclass(frozen=True, slots=True)
class Seen:
    """What this instance last saw of another: its session and beat, and when (monotonic)."""

    session: str
    beat: int
    at: float


class Membership:
    """This instance's entry in the record, its view of the others, and its share.

    `join` before the first runs, `beat` every `interval` seconds (read again after each
    beat: it follows `takeover`), `leave` when stopping. `need` before a beat tells it the
    takeover this instance's own tokens need (`takeover_needed`). `owns(name)` answers from
    the last view; `join` and `beat` return whether the share may have changed since either
    last returned (the set of live instances moved, or this one stood down or came back): then
    the caller plans again who runs what."""

    def __init__(
        self,
        store: KvStore,
        *,
        state_prefix: str,
        instance_id: str,
        takeover_after: float,
        clock: Clock,
        host: str,
        address: str | None = None,
        pid: int = 0,
        session: str | None = None,
        on_problem: Callable[[str, str], None] | None = None,
        process_alive: Callable[[int], bool] | None = None,
    ) -> None:
        self._store = store
        self._path = members_path(state_prefix)
        self._clock = clock
        self.instance = instance_id
        self.takeover_after = takeover_after  # the cap, as configured
        self._need: float | None = None  # what this instance's own tokens need
        self._takeover = max(MIN_TAKEOVER, takeover_after)  # what it beats to
        self._takeover_logged = self._takeover  # (tokens' lifetimes vary by a second or so)
        self._me = Member(
            instance=instance_id,
            session=session or secrets.token_hex(8),
            host=host,
            address=address,
            pid=pid,
            started=clock.time(),
            beat=0,
            beat_at=clock.time(),
        )
        self._process_alive = process_alive or pid_alive
        # Told of what on-call must hear (kind, message): a namesake, skew, a failing beat.
        self._on_problem = on_problem or (lambda _kind, _message: None)
        self._seen: dict[str, Seen] = {}  # the other instances, by id
        self._live: tuple[str, ...] = (instance_id,)
        self._owned: dict[str, bool] = {}  # owns() answers, until the live set moves
        # Another process writing under our id (a namesake) that is older: while it beats,
        # this one owns nothing; it is watched here.
        self._namesake: Seen | None = None
        # A crashed process's (session, beat) under our id, replaced at join: its entry is not
        # a namesake's unless that beat moves again.
        self._predecessor: tuple[str, int] | None = None
        self._written: int | None = None  # the record version of this instance's last beat
        self._last_written_at: float | None = None  # monotonic
        self._skew_warned = False
        self._beat_reported = False  # this run of failed beats was reported
        self._skew_measured: float | None = None  # monotonic
        self._told: tuple[tuple[str, ...], bool] = (self._live, False)  # last answered for

    @property
    def takeover(self) -> float:
        """The takeover this instance beats to: the least of `takeover_after`, its own need and
        the needs the other live instances advertise (at least MIN_TAKEOVER), as of the last
        beat that read the record."""
        return self._takeover

    @property
    def interval(self) -> float:
        """Seconds between beats: a third of `takeover`."""
        return self._takeover / BEATS_PER_TAKEOVER

    def need(self, seconds: float | None) -> None:
        """The takeover this instance's own share needs (`takeover_needed`; None: none known),
        advertised and followed from the next beat on."""
        self._need = None if seconds is None else max(MIN_TAKEOVER, seconds)

    @property
    def live(self) -> tuple[str, ...]:
        """The instance ids this one counts as alive, sorted, its own included (while it
        stands down, its id is the namesake's)."""
        return self._live

    @property
    def standing_down(self) -> bool:
        return self._namesake is not None

    def owns(self, credential: str) -> bool:
        """Whether `credential` is in this instance's share, by the last view."""
        if self._namesake is not None:
            return False
        owned = self._owned.get(credential)
        if owned is None:
            owned = self._owned[credential] = owner(credential, self._live) == self.instance
        return owned

    async def join(self) -> bool:
        """The first beat. An entry under this instance id from another process is a crashed
        predecessor's when it is old, or was written on this host by a process that is gone
        (or had our pid: a container's restart): it is replaced at once, for a restart after a
        crash must not wait while its tokens run out. A recent one from elsewhere may be a
        namesake's: wait one beat; if it moved, stand down. (A namesake taken for a crashed
        one is found out at the next beats, `_check_namesake`.)"""
        other = await self._entry_under_our_id()
        if other is None or other.session == self._me.session:
            return await self.beat()
        takeover = gone_after(other, self.takeover_after)
        recent = self._clock.time() - other.beat_at < takeover
        if recent and not self._crashed_here(other):
            wait = takeover / BEATS_PER_TAKEOVER  # one beat of that process
            log.info("members.waiting", instance=self.instance, seconds=round(wait, 1))
            await self._clock.sleep(wait + 1.0)
            current = await self._entry_under_our_id()
            if current is not None and (current.session, current.beat) != (
                other.session,
                other.beat,
            ):
                self._stand_down(current)  # it moved: alive
        if not self.standing_down:
            self._predecessor = (other.session, other.beat)
        return await self.beat()

    def _crashed_here(self, other: Member) -> bool:
        """`other` ran on this host and its process is gone (or was this pid)."""
        if other.host != self._me.host:
            return False
        return other.pid == self._me.pid or not self._process_alive(other.pid)

    async def beat(self) -> bool:
        """Read the record, judge who is alive, write this instance's entry (unless it stands
        down). A failed beat keeps the last view."""
        for _attempt in range(WRITE_ATTEMPTS):
            try:
                entry = await self._store.read(self._path, consistent=True)
                members = read_members(entry, self._path)
                self._measure_skew(entry)
                self._check_namesake(members.get(self.instance))
                self._judge(members)
                self._follow(members)
                if not self.standing_down:
                    await self._write(entry, members)
                    await self._check_clock()
                return self._news()
            except VaultCasConflict:
                continue  # another instance beat between our read and our write
            except KeyturnError as error:
                self._beat_failed(error)
                return self._news()
        self._beat_failed(None)
        return self._news()

    def _news(self) -> bool:
        """Whether the view changed since `join`/`beat` last answered: a beat whose write
        failed after its read moved the view must still say so."""
        view = (self._live, self.standing_down)
        changed, self._told = view != self._told, view
        return changed

    async def leave(self) -> None:
        """Take this instance's entry out of the record (stopping): its share moves now."""
        if self.standing_down:
            return
        for _attempt in range(WRITE_ATTEMPTS):
            try:
                entry = await self._store.read(self._path, consistent=True)
                members = read_members(entry, self._path)
                mine = members.get(self.instance)
                if entry is None or mine is None or mine.session != self._me.session:
                    return
                data = {name: m.to_json() for name, m in members.items() if name != self.instance}
                await self._store.write(self._path, data, cas=entry.version)
                log.info("members.left", instance=self.instance)
                return
            except VaultCasConflict:
                continue
            except KeyturnError as error:
                log.warning("members.leave_failed", instance=self.instance, error=str(error))
                return

    # -- the view -----------------------------------------------------------------------------

    def _judge(self, members: Mapping[str, Member]) -> None:
        """Which instances are alive now: each judged by its own advertised takeover."""
        now_mono, now = self._clock.monotonic(), self._clock.time()
        live, seen = {self.instance}, {}
        for name, member in members.items():
            if name == self.instance:
                continue
            seen[name] = self._sighting(self._seen.get(name), member, now_mono, now)
            if now_mono - seen[name].at < gone_after(member, self.takeover_after):
                live.add(name)
        self._seen = seen
        self._set_live(tuple(sorted(live)), members)

    def _follow(self, members: Mapping[str, Member]) -> None:
        """The takeover to beat to from now on: the least of `takeover_after`, this
        instance's need and the needs of the other live instances, at least MIN_TAKEOVER. A
        live instance's credentials are this one's to take over should it die, so its need
        is this one's too."""
        needs = [members[name].needs for name in self._live if name != self.instance]
        wanted = [self.takeover_after, self._need, *needs]
        takeover = max(MIN_TAKEOVER, min(s for s in wanted if s is not None))
        if abs(takeover - self._takeover_logged) >= TAKEOVER_LOGGED * self._takeover_logged:
            log.info(
                "members.takeover",
                instance=self.instance,
                seconds=round(takeover, 3),
                beat_every=round(takeover / BEATS_PER_TAKEOVER, 3),
                was=round(self._takeover_logged, 3),
            )
            self._takeover_logged = takeover
        self._takeover = takeover

    @staticmethod
    def _sighting(before: Seen | None, member: Member, now_mono: float, now: float) -> Seen:
        """When `member` last moved, on this instance's monotonic clock: now if its session or
        beat differs from the last look; at first sight, as long ago as its own clock says
        (the one place another host's wall clock counts)."""
        if before is not None and (before.session, before.beat) == (member.session, member.beat):
            return before
        age = 0.0 if before is not None else max(0.0, now - member.beat_at)
        return Seen(member.session, member.beat, now_mono - age)

    def _set_live(self, live: tuple[str, ...], members: Mapping[str, Member]) -> None:
        previous = set(self._live)
        for name in sorted(set(live) - previous):
            log.info("members.joined", instance=name, host=members[name].host)
        for name in sorted(previous - set(live)):
            reason = "silent" if name in members else "left"
            log.warning("members.gone", instance=name, reason=reason)
        if live != self._live:
            self._live, self._owned = live, {}

    # -- this instance's entry ----------------------------------------------------------------

    async def _write(self, entry: KvEntry | None, members: Mapping[str, Member]) -> None:
        """This instance's beat, with the others' entries as read (gone ones kept for an hour,
        for `keyturn status --instances`)."""
        now = self._clock.time()
        me = replace(
            self._me,
            beat=self._me.beat + 1,
            beat_at=now,
            takeover=round(self._takeover, 3),
            needs=None if self._need is None else round(self._need, 3),
        )
        kept = {
            name: m
            for name, m in members.items()
            if name != self.instance and (name in self._live or now - m.beat_at < FORGET_AFTER)
        }
        data = {name: m.to_json() for name, m in kept.items()} | {self.instance: me.to_json()}
        self._written = await self._store.write(
            self._path, data, cas=entry.version if entry is not None else 0
        )
        self._me, self._last_written_at = me, self._clock.monotonic()
        self._beat_reported = False

    async def _check_clock(self) -> None:
        """Now and then read the record right after this instance's beat, while its version is
        most likely still ours, to measure the skew (at other times another instance's beat
        usually came between)."""
        now = self._clock.monotonic()
        if self._skew_measured is not None and now - self._skew_measured < SKEW_EVERY:
            return
        try:
            self._measure_skew(await self._store.read(self._path, consistent=True))
        except KeyturnError:
            return  # the next beat tries again

    def _measure_skew(self, entry: KvEntry | None) -> None:
        """If the record's latest version is this instance's last beat, its clock's distance
        from Vault's: `beat_at` was taken just before the write, `created_time` is Vault's."""
        if entry is None or self._written is None or entry.version != self._written:
            return
        skew = round(self._me.beat_at - entry.created_time, 3)
        self._me, self._skew_measured = replace(self._me, skew=skew), self._clock.monotonic()
        if abs(skew) > SKEW_WARNING and not self._skew_warned:
            self._skew_warned = True
            log.warning("members.clock_skew", instance=self.instance, skew_seconds=skew)
            self._on_problem(
                "clock_skew",
                f"the clock of instance {self.instance} is {skew:+.1f}s from Vault's; leases "
                "are dated by wall clocks: keep the hosts in sync (NTP)",
            )
        elif abs(skew) <= SKEW_WARNING / 2 and self._skew_warned:
            self._skew_warned = False
            log.info("members.clock_in_sync", instance=self.instance, skew_seconds=skew)

    def _check_namesake(self, holder: Member | None) -> None:
        """Our id's entry as read. Written by another process (a namesake), the younger of the
        two stands down; the one standing down comes back once the namesake left or went
        silent for the takeover it advertises."""
        ours = (
            holder is None
            or holder.session == self._me.session
            or (holder.session, holder.beat) == self._predecessor
        )
        if self._namesake is not None:
            if ours:
                self._resume()
                return
            assert holder is not None
            sighting = self._sighting(
                self._namesake, holder, self._clock.monotonic(), self._clock.time()
            )
            self._namesake = sighting
            if self._clock.monotonic() - sighting.at >= gone_after(holder, self.takeover_after):
                self._resume()
            return
        if ours:
            return
        assert holder is not None
        self._report_namesake()
        if (holder.started, holder.session) < (self._me.started, self._me.session):
            self._stand_down(holder)

    def _stand_down(self, holder: Member) -> None:
        self._namesake = Seen(holder.session, holder.beat, self._clock.monotonic())
        self._report_namesake()

    def _resume(self) -> None:
        self._namesake = None
        log.info("members.resumed", instance=self.instance)

    def _report_namesake(self) -> None:
        log.error("members.duplicate_instance_id", instance=self.instance)
        self._on_problem(
            "duplicate_instance_id",
            f"two keyturn processes run with instance_id {self.instance}: give each instance "
            "its own; until then the younger one owns no credential",
        )

    def _beat_failed(self, error: KeyturnError | None) -> None:
        """Logged at every failure; reported once per run of failures, when the others count
        this instance as gone (silent for the takeover it last advertised), and only if there
        are others: a lone instance's share goes to nobody, and its beat failing is then no
        news beyond the log (a sealed Vault is reported by what it stops)."""
        now = self._clock.monotonic()
        since = None if self._last_written_at is None else now - self._last_written_at
        log.warning(
            "members.beat_failed",
            instance=self.instance,
            error=str(error) if error else f"{WRITE_ATTEMPTS} check-and-set conflicts in a row",
            seconds_since_last_beat=None if since is None else round(since, 1),
        )
        judged_by = self._me.takeover if self._me.takeover is not None else self.takeover_after
        others = any(name != self.instance for name in self._live)
        if (since is None or since >= judged_by) and others and not self._beat_reported:
            self._beat_reported = True
            self._on_problem(
                "beat_failed",
                f"instance {self.instance} has not written its heartbeat "
                f"{'since it started' if since is None else f'for {since:.0f}s'}: the other "
                "instances take its share; it keeps running it too (leases keep runs apart)",
            )

    async def _entry_under_our_id(self) -> Member | None:
        """The record's entry under this instance id (None also when it cannot be read)."""
        try:
            entry = await self._store.read(self._path, consistent=True)
        except KeyturnError as error:
            self._beat_failed(error)
            return None
        return read_members(entry, self._path).get(self.instance)
