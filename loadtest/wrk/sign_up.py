#!/usr/bin/env python3
"""Signs N users up on a running server and prints wrk's users file.

    loadtest/wrk/sign_up.py http://127.0.0.1:8090 200 > users.txt

One line per user, "TOKEN FROM_WALLET_ID TO_WALLET_ID": each user sends
to the next one's wallet, the last to the first's.
"""
import json
import secrets
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SIGN_UPS_IN_FLIGHT = 8


def sign_up(base_url: str, name: str) -> dict:
    body = json.dumps({"name": name, "password": "correct horse battery staple"}).encode()
    request = urllib.request.Request(
        f"{base_url}/api/v1/users", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def main() -> None:
    base_url, count = sys.argv[1].rstrip("/"), int(sys.argv[2])
    run = secrets.token_hex(4)
    names = [f"wrk-{run}-{n}" for n in range(count)]
    with ThreadPoolExecutor(SIGN_UPS_IN_FLIGHT) as pool:
        users = list(pool.map(lambda name: sign_up(base_url, name), names))
    for n, user in enumerate(users):
        to = users[(n + 1) % len(users)]
        print(user["token"], user["wallet_id"], to["wallet_id"])


if __name__ == "__main__":
    main()
