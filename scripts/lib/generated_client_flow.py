"""README's "Try the API", through a client openapi-python-client generated
from the document the server serves (scripts/check-generated-client).

It uses nothing but the generated package: its operations, its models and
their parsing of every answer. Each step asserts what the README promises,
then the ids it made are written to the file named by FLOW_RESULT for the
database checks that follow.

    BASE_URL=http://127.0.0.1:8080 FLOW_RESULT=out.json python generated_client_flow.py
"""

import json
import os
import random
import time
import uuid

from layered_wallet_client import AuthenticatedClient, Client
from layered_wallet_client.api.payouts import create_payout, get_payout
from layered_wallet_client.api.transfers import create_transfer
from layered_wallet_client.api.users import sign_up
from layered_wallet_client.api.wallets import get_wallet
from layered_wallet_client.models import Credentials, PayoutBody, PayoutState, Problem, TransferBody

BASE_URL = os.environ["BASE_URL"]
AMOUNT = 1250
PAYOUT = 300
# How long a payout may take to be sent and settled by the dispatcher
# before the flow gives up: a bound on waiting, not a measure of speed.
SETTLE_WAIT_S = 120


def expect(condition, what):
    if not condition:
        raise SystemExit(f"generated client flow: {what}")


def signed_up(client, name):
    answer = sign_up.sync_detailed(client=client, body=Credentials(name=name, password="correct horse"))
    expect(answer.status_code == 201, f"sign-up of {name} answered {answer.status_code}: {answer.content!r}")
    return answer.parsed


def main():
    anonymous = Client(base_url=BASE_URL, raise_on_unexpected_status=True)
    suffix = random.randrange(1_000_000)
    alice = signed_up(anonymous, f"alice-{suffix}")
    bob = signed_up(anonymous, f"bob-{suffix}")
    client = AuthenticatedClient(base_url=BASE_URL, token=alice.token, raise_on_unexpected_status=True)
    key = str(uuid.uuid4())
    body = TransferBody(from_wallet_id=alice.wallet_id, to_wallet_id=bob.wallet_id, amount_minor=AMOUNT)

    def pay():
        return create_transfer.sync_detailed(client=client, body=body, idempotency_key=key)

    first = pay()
    expect(first.status_code == 201, f"the first transfer answered {first.status_code}: {first.content!r}")
    receipt = first.parsed
    expect(receipt.amount_minor == AMOUNT, f"the receipt moved {receipt.amount_minor}")
    expect(receipt.balance_minor_after == alice.balance_minor - AMOUNT, "the receipt's balance after")

    burst = pay()
    expect(burst.status_code == 429, f"the second transfer answered {burst.status_code}, not 429")
    expect(isinstance(burst.parsed, Problem), "the 429 parsed as a problem")
    expect(burst.parsed.type_ == "/problems/cooldown-active", f"the 429's type is {burst.parsed.type_}")
    retry_after = int(burst.headers["retry-after"])

    time.sleep(retry_after)
    replay = pay()
    expect(replay.status_code == 201, f"the replay answered {replay.status_code}: {replay.content!r}")
    expect(replay.headers.get("idempotent-replayed") == "true", "the replay says Idempotent-Replayed: true")
    expect(replay.content == first.content, "the replay's bytes differ from the first answer's")

    wallet = get_wallet.sync_detailed(client=client, id=alice.wallet_id)
    expect(wallet.status_code == 200, f"reading the wallet answered {wallet.status_code}")
    expect(wallet.parsed.balance_minor == alice.balance_minor - AMOUNT, "the balance moved once")

    payout = create_payout.sync_detailed(
        client=client,
        body=PayoutBody(from_wallet_id=alice.wallet_id, amount_minor=PAYOUT, destination="acct:generated-client"),
        idempotency_key=str(uuid.uuid4()),
    )
    expect(payout.status_code == 202, f"the payout answered {payout.status_code}: {payout.content!r}")
    payout_id = payout.parsed.id
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        read = get_payout.sync_detailed(client=client, id=payout_id)
        expect(read.status_code == 200, f"reading the payout answered {read.status_code}")
        if read.parsed.state == PayoutState.SETTLED:
            break
        expect(read.parsed.state in (PayoutState.PENDING, PayoutState.SENT), f"the payout is {read.parsed.state}")
        expect(time.monotonic() < deadline, f"the payout is still {read.parsed.state} after {SETTLE_WAIT_S} s")
        time.sleep(0.5)
    expect(read.parsed.gateway_reference, "a settled payout names the gateway's reference")

    with open(os.environ["FLOW_RESULT"], "w") as result:
        json.dump(
            {
                "from_wallet_id": str(alice.wallet_id),
                "to_wallet_id": str(bob.wallet_id),
                "key": key,
                "transfer_id": str(receipt.id),
                "payout_id": str(payout_id),
                "opening_minor": alice.balance_minor,
            },
            result,
        )
    print(f"generated client flow: transfer {receipt.id} once, replayed byte for byte; payout {payout_id} settled")


if __name__ == "__main__":
    main()
