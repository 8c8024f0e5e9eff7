// The race lab: fire N concurrent requests at the public transfer endpoint
// and show which defense decided each one. Plain JavaScript, no libraries.
(function () {
  "use strict";
  const form = document.getElementById("lab");
  const walletId = form.dataset.walletId;
  const csrf = form.dataset.csrf;
  const currency = form.dataset.currency;
  const traceUrl = form.dataset.traceUrl;

  // A v4 UUID from the browser's random source (crypto.randomUUID needs a
  // secure context; this works behind a plain-HTTP proxy too).
  function uuid() {
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return h.slice(0, 8) + "-" + h.slice(8, 12) + "-" + h.slice(12, 16) + "-" + h.slice(16, 20) + "-" + h.slice(20);
  }

  function money(minor) {
    const sign = minor < 0 ? "-" : "";
    const abs = Math.abs(minor);
    const whole = Math.floor(abs / 100).toLocaleString("en-US");
    const symbol = { USD: "$", EUR: "€", GBP: "£" }[currency] || currency + " ";
    return sign + symbol + whole + "." + String(abs % 100).padStart(2, "0");
  }

  // The server's amount grammar, word for word (data-amount-pattern): a
  // comma only between thousands, a dot and at most two decimals.
  const amountGrammar = new RegExp("^(?:" + form.dataset.amountPattern + ")$");

  function parseMajor(text) {
    if (!amountGrammar.test(text)) return null;
    const [whole, cents] = text.trim().replace(/,/g, "").split(".");
    const minor = parseInt(whole, 10) * 100 + parseInt((cents || "0").padEnd(2, "0"), 10);
    return minor > 0 ? minor : null;
  }

  async function balance() {
    const r = await fetch("/api/v1/wallets/" + walletId, { credentials: "same-origin" });
    if (!r.ok) throw new Error("could not read the balance (" + r.status + ")");
    return (await r.json()).balance_minor;
  }

  // Resolves a name to a wallet id through the wallet page's own lookup:
  // a wallet id is used as is.
  function recipientWallet(text) {
    return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text.trim()) ? text.trim() : null;
  }

  function decisionOf(header) {
    const out = { layer: "-", outcome: "-" };
    (header || "").split(",").forEach(function (member) {
      const [k, v] = member.split("=").map((s) => (s || "").trim());
      if (k === "layer" || k === "outcome") out[k] = v;
    });
    return out;
  }

  async function fireOne(body, key) {
    const headers = { "Content-Type": "application/json", "X-CSRF-Token": csrf };
    if (key) headers["Idempotency-Key"] = key;
    const started = performance.now();
    try {
      const r = await fetch("/api/v1/transfers", { method: "POST", credentials: "same-origin", headers, body: JSON.stringify(body) });
      await r.text();
      const d = decisionOf(r.headers.get("Defense-Decision"));
      const tp = (r.headers.get("traceparent") || "").split("-");
      return { status: r.status, layer: d.layer, outcome: d.outcome, replayed: r.headers.has("Idempotent-Replayed"),
               ms: performance.now() - started, traceId: tp.length === 4 ? tp[1] : "" };
    } catch (e) {
      return { status: 0, layer: "-", outcome: "network error", replayed: false, ms: performance.now() - started, traceId: "" };
    }
  }

  function summaryText(results) {
    const counts = {};
    results.forEach(function (r) {
      const label = r.outcome === "rejected" && r.layer === "cooldown" ? "cooldown" : r.outcome.replace(/_/g, " ");
      counts[label] = (counts[label] || 0) + 1;
    });
    return Object.keys(counts).sort((a, b) => counts[b] - counts[a]).map((k) => counts[k] + " " + k).join(" · ");
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const button = document.getElementById("fire");
    const scenario = form.querySelector("input[name=scenario]:checked").value;
    const count = Math.max(2, Math.min(200, parseInt(document.getElementById("count").value, 10) || 2));
    const amount = parseMajor(document.getElementById("lab-amount").value);
    let to = recipientWallet(document.getElementById("lab-recipient").value);
    const results = document.getElementById("results");
    const damage = document.getElementById("damage");
    if (!amount) {
      alert("We read “" + document.getElementById("lab-amount").value.trim() + "”, which is not an amount. " +
            "Type digits with a dot for the cents, such as 9.50 or 1,234.50.");
      return;
    }
    button.disabled = true;
    try {
      if (!to) {
        const name = document.getElementById("lab-recipient").value.trim();
        const r = await fetch("/race-lab/recipient?name=" + encodeURIComponent(name), { credentials: "same-origin" });
        if (!r.ok) { alert("No user called “" + name + "”."); return; }
        to = (await r.json()).wallet_id;
      }
      const before = await balance();
      const body = { from_wallet_id: walletId, to_wallet_id: to, amount_minor: amount };
      const sharedKey = uuid();
      const requests = [];
      for (let i = 0; i < count; i++) {
        const key = scenario === "same-key" ? sharedKey : scenario === "no-key" ? null : uuid();
        requests.push(fireOne(body, key));
      }
      const outcomes = await Promise.all(requests);
      const after = await balance();

      const tbody = document.querySelector("#requests tbody");
      tbody.textContent = "";
      outcomes.forEach(function (r, i) {
        const tr = document.createElement("tr");
        const cells = [String(i + 1), String(r.status || "—"), r.layer, r.outcome + (r.replayed ? " (replayed)" : ""), r.ms.toFixed(1) + " ms"];
        cells.forEach(function (text, c) {
          const td = document.createElement("td");
          td.textContent = text;
          if (c === 3) td.className = "outcome-" + r.outcome;
          if (c === 4) td.className = "num";
          tr.appendChild(td);
        });
        const trace = document.createElement("td");
        if (traceUrl && r.traceId) {
          const a = document.createElement("a");
          a.href = traceUrl.replace("{trace_id}", r.traceId);
          a.textContent = r.traceId.slice(0, 8) + "…";
          trace.appendChild(a);
        } else {
          trace.textContent = r.traceId ? r.traceId.slice(0, 8) + "…" : "";
        }
        tr.appendChild(trace);
        tbody.appendChild(tr);
      });
      const moved = before - after;
      const charged = outcomes.filter((r) => r.status === 201 && !r.replayed).length;
      document.getElementById("summary").textContent = summaryText(outcomes);
      document.getElementById("lab-balance").textContent = money(after);
      document.getElementById("balances").textContent = "Balance " + money(before) + " → " + money(after) +
        ": " + money(moved) + " moved = " + Math.round(moved / amount) + " × " + money(amount) + ".";
      if (scenario === "same-key" && charged > 1) {
        damage.hidden = false;
        damage.textContent = "Charged " + charged + " times for one request with one key.";
      } else if (scenario === "no-key" && charged > 1) {
        damage.hidden = false;
        damage.textContent = "Charged " + charged + " times for one double click.";
      } else {
        damage.hidden = true;
      }
      results.hidden = false;
      results.dataset.done = "true";
    } catch (e) {
      alert(e.message);
    } finally {
      button.disabled = false;
    }
  });
})();
