"""Keys file validation, budget periods and the ledger's reservations (no server)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from radixserve.server.tenancy.budget import Ledger, LimitExceeded, period_bounds
from radixserve.server.tenancy.keys import KeysFileError, KeySpec, load_keys, parse_keys
from radixserve.server.tenancy.usage_db import UsageDB

GOOD = {"key": "sk-a", "name": "alice"}


@pytest.mark.parametrize("entry, message", [
    ({**GOOD, "budget_tokens": 0}, "keys[1].budget_tokens: must be a positive integer"),
    ({**GOOD, "budget_tokens": "100"}, "keys[1].budget_tokens: must be a positive integer"),
    ({**GOOD, "requests_per_minute": -1}, "keys[1].requests_per_minute: must be a positive integer"),
    ({**GOOD, "period": "week"}, "keys[1].period: must be one of minute, hour, day, month"),
    ({**GOOD, "routes": []}, "keys[1].routes: must be a non-empty list"),
    ({**GOOD, "routes": ["v1/*"]}, "keys[1].routes: must be a non-empty list"),
    ({**GOOD, "admin": "yes"}, "keys[1].admin: must be true or false"),
    ({**GOOD, "budget": 5}, "keys[1].budget: unknown field"),
    ({"name": "alice"}, "keys[1].key: required"),
    ({"key": "sk-a"}, "keys[1].name: required"),
    ({**GOOD, "name": "a b"}, "keys[1].name: must be 1-64 characters"),
    ({**GOOD, "key": "sk-0"}, "keys[1].key: duplicate of keys[0].key"),
    ({**GOOD, "name": "zero"}, "keys[1].name: duplicate of keys[0].name"),
    ({**GOOD, "cache_salt": ""}, "keys[1].cache_salt: must be a non-empty string"),
])
def test_bad_entries_name_the_entry_and_field(entry, message):
    with pytest.raises(KeysFileError) as e:
        parse_keys({"keys": [{"key": "sk-0", "name": "zero"}, entry]})
    assert str(e.value).startswith(message)


def test_bad_files_name_the_file(tmp_path):
    p = tmp_path / "keys.toml"
    p.write_text('[[keys]]\nkey = "sk-a"\nname = "a"\nbudget_tokens = -5\n')
    with pytest.raises(KeysFileError, match=r"^keys.toml: keys\[0\].budget_tokens: must be a positive integer"):
        load_keys(str(p))
    p.write_text("[[keys]\n")
    with pytest.raises(KeysFileError, match=r"^keys.toml: invalid TOML"):
        load_keys(str(p))
    p.write_text("")
    with pytest.raises(KeysFileError, match=r"^keys.toml: keys: at least one"):
        load_keys(str(p))
    with pytest.raises(KeysFileError, match=r"^nope.toml: cannot read"):
        load_keys(str(tmp_path / "nope.toml"))


def test_good_file_and_routes(tmp_path):
    p = tmp_path / "keys.toml"
    p.write_text('[[keys]]\nkey = "sk-a"\nname = "a"\nbudget_tokens = 10\nperiod = "hour"\n'
                 'routes = ["/v1/*"]\ncache_salt = "team"\n\n[[keys]]\nkey = "sk-root"\nname = "root"\nadmin = true\n')
    table = load_keys(str(p))
    a, root = table.by_secret["sk-a"], table.by_name("root")
    assert (a.budget_tokens, a.period, a.salt, root.salt) == (10, "hour", "team", "root")
    assert a.may_call("/v1/chat/completions") and not a.may_call("/generate") and not a.may_call("/v1/usage")
    assert root.may_call("/v1/usage") and root.may_call("/metrics")


def test_period_bounds_are_utc_calendar_periods():
    now = datetime(2024, 2, 29, 13, 45, 30, tzinfo=timezone.utc).timestamp()
    day = period_bounds("day", now)
    assert day == (datetime(2024, 2, 29, tzinfo=timezone.utc).timestamp(),
                   datetime(2024, 3, 1, tzinfo=timezone.utc).timestamp())
    month = period_bounds("month", now)
    assert month[1] - month[0] == 29 * 86400
    assert period_bounds("minute", now)[1] - now == 30
    assert period_bounds("hour", now)[0] == datetime(2024, 2, 29, 13, tzinfo=timezone.utc).timestamp()


def test_ledger_reserves_charges_and_persists(tmp_path):
    path = str(tmp_path / "usage.db")
    spec = KeySpec("sk", "k", budget_tokens=100, period="day", requests_per_minute=2)
    ledger, now = Ledger(UsageDB(path)), 1_700_000_000.0
    ledger.admit(spec, 60, now)
    with pytest.raises(LimitExceeded) as e:  # 60 reserved + 50 > 100
        ledger.admit(spec, 50, now)
    assert e.value.reason == "budget" and e.value.retry_after == period_bounds("day", now)[1] - now
    assert ledger.keys["k"].reserved == 60  # the refused request reserved nothing
    ledger.settle("k", "day", 60, prompt=10, cached=4, completion=20, requests=1, now=now)  # used 30 of 60
    ledger.admit(spec, 70, now)
    ledger.settle("k", "day", 70, prompt=5, cached=0, completion=0, requests=1, now=now)
    with pytest.raises(LimitExceeded) as e:  # a third request within the minute
        ledger.admit(spec, 1, now + 1)
    assert e.value.reason == "rate_limit" and e.value.retry_after == 59
    # a new ledger over the same file (a restart) finds the charges
    again = Ledger(UsageDB(path))
    assert again.state("k", "day", now).used == 35
    rows = {r["period"]: r for r in again.db.rows("k")}
    assert set(rows) == {"day", "month"}
    assert (rows["day"]["prompt_tokens"], rows["day"]["cached_tokens"], rows["day"]["completion_tokens"],
            rows["day"]["requests"]) == (15, 4, 20, 2)
    # the next day starts from zero
    assert again.state("k", "day", now + 86400).used == 0


def test_accounting_charges_prompts_once_and_releases_every_reservation(tmp_path):
    from radixserve.ipc.server_link import TokenizedRequest
    from radixserve.metrics import Metrics
    from radixserve.request import FinishReason
    from radixserve.sampling_params import SamplingParams
    from radixserve.server.tenancy.accounting import Accounting, current_key
    from radixserve.server.tenancy.keys import KeyStore, KeyTable
    from radixserve.server.req_state import ReqState, RequestError

    spec = KeySpec("sk", "k", budget_tokens=1000, cache_salt="team")
    store = KeyStore("unused.toml", KeyTable({"sk": spec}))
    acct = Accounting(Ledger(UsageDB(str(tmp_path / "u.db"))), Metrics(), store)

    def reqs(prefix: str, n: int, salt=None) -> list[TokenizedRequest]:
        return [TokenizedRequest(f"{prefix}-{j}", [1] * 10, SamplingParams(max_new_tokens=20, cache_salt=salt),
                                 copy=j) for j in range(n)]

    def end(r: TokenizedRequest, n_out: int, finish: str = "length", error: bool = False) -> None:
        st = ReqState(r.rid, 0, r.input_ids, output_ids=[7] * n_out, cached_tokens=4,
                      finish_reason=None if error else FinishReason(type=finish))
        st.error = RequestError(400, "x") if error else None
        acct.settle(st)

    token = current_key.set(spec)
    try:
        a = reqs("a", 2, salt="mine")  # needs 10 + 2 * 20
        acct.admit(a)
        assert [r.sampling.cache_salt for r in a] == ["team\0mine"] * 2
        assert acct.ledger.keys["k"].reserved == 50
        end(a[0], 0, finish="abort")  # aborted before its first token
        end(a[1], 5)  # the other copy computed the prompt: charged once, with the last copy
        b = reqs("b", 1)
        acct.admit(b)
        end(b[0], 0, error=True)  # refused by the scheduler: nothing charged, not counted
        with pytest.raises(RequestError) as e:  # 10 + 50 * 20 > 1000 - 15
            acct.admit(reqs("c", 50))
        assert e.value.status == 429 and e.value.headers["Retry-After"].isdigit()
    finally:
        current_key.reset(token)
    assert (acct.ledger.keys["k"].used, acct.ledger.keys["k"].reserved, acct.pending) == (15, 0, {})
    row = {r["period"]: r for r in acct.ledger.db.rows("k")}["day"]
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["requests"]) == (10, 4, 5, 1)


def test_open_accounting_startup_errors_name_the_field(tmp_path):
    from radixserve.config import ServerConfig
    from radixserve.server.tenancy.accounting import StartupError, open_accounting

    good = tmp_path / "keys.toml"
    good.write_text('[[keys]]\nkey = "sk"\nname = "k"\n')
    with pytest.raises(StartupError, match="^api_keys_file: give either --api-key or --api-keys-file"):
        open_accounting(ServerConfig(api_key="x", api_keys_file=str(good)))
    with pytest.raises(StartupError, match="^usage_db: cannot open"):
        open_accounting(ServerConfig(api_keys_file=str(good), usage_db=str(tmp_path / "no" / "u.db")))
    assert open_accounting(ServerConfig()) == (None, None)
    keys, db = open_accounting(ServerConfig(api_keys_file=str(good)))  # in memory, with a warning
    assert keys.lookup("sk").name == "k" and db.path == ":memory:"
