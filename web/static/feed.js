// The live feed: recent decisions, then new ones pushed over Server-Sent
// Events from every instance.
(function () {
  "use strict";
  const table = document.getElementById("feed");
  const tbody = table.querySelector("tbody");
  const status = document.getElementById("feed-status");
  const empty = document.getElementById("feed-empty");
  const filter = document.getElementById("feed-filter");
  const moneyFilter = document.getElementById("feed-money");
  // Rows kept per kind of money, so that a lab burst never pushes a real
  // transfer off the page.
  const ROWS_PER_MONEY_MAX = 200;
  const labWallets = new Set((table.dataset.labWallets || "").split(",").filter(Boolean));
  const currency = table.dataset.currency || "";
  // The wallets the page can name (the visitor's own, and the owners of
  // those they sent to lately); any other is told by its id's short form.
  const walletNames = JSON.parse(table.dataset.walletNames || "{}");
  // Instances numbered in the order they first appear: a host name says
  // nothing to a visitor, and with one instance the column is left out.
  const instances = new Map();
  const LAYERS = { cooldown: "Cooldown lock", idempotency: "Idempotency key", row_guard: "Row guard",
    edge_lock: "Edge lock", inbox: "Inbox", gateway: "Bank gateway", none: "Before the layers" };

  // One zone for every entry, whatever the visitor's clock says.
  function utc(time) {
    return new Date(time).toISOString().slice(11, 23);
  }

  // An id shortened for people: its last 8 hex digits, the part that differs
  // (ids are UUIDv7, whose first digits are a timestamp).
  function shortId(id) {
    const hex = String(id).replace(/-/g, "");
    return "…" + hex.slice(-8);
  }

  function walletName(id) {
    return walletNames[id] || "wallet " + shortId(id);
  }

  function instanceNumber(id) {
    if (!instances.has(id)) instances.set(id, instances.size + 1);
    table.classList.toggle("one-instance", instances.size < 2);
    return instances.get(id);
  }

  // A race-lab request (its stream says so), or a transfer to one of the
  // visitor's lab wallets (where a deployment keeps every layer on and the
  // lab's requests carry no switches): the row guard lets lab money move
  // only between a visitor's own two.
  function isLab(entry) {
    return Boolean(entry.lab) || (Boolean(entry.to_wallet_id) && labWallets.has(entry.to_wallet_id));
  }

  function money(minor, code) {
    return code + " " + (minor / 100).toFixed(2);
  }

  function kindOf(entry) {
    if (entry.outcome === "accepted" || entry.outcome === "degraded") return "moved";
    if (entry.layer === "cooldown" || entry.layer === "idempotency" || entry.layer === "row_guard") return entry.layer;
    return "other";
  }

  // Each cell carries its column's heading, so that on a narrow screen,
  // where the rows are stacked instead of laid out as a table, each value
  // still says what it is.
  const headings = Array.from(document.querySelectorAll("#feed thead th")).map((th) => th.textContent);

  function cell(tr, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    td.dataset.label = headings[tr.children.length] || "";
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  }

  function show(tr) {
    tr.hidden = (filter.value !== "all" && tr.dataset.kind !== filter.value) ||
      (moneyFilter.value !== "all" && tr.dataset.money !== moneyFilter.value);
  }

  function row(entry) {
    const tr = document.createElement("tr");
    tr.dataset.kind = kindOf(entry);
    const lab = isLab(entry);
    tr.dataset.money = lab ? "lab" : "real";
    cell(tr, utc(entry.time));
    const decision = cell(tr, (LAYERS[entry.layer] || entry.layer) + ": " + entry.outcome.replace(/_/g, " ") + " (" + entry.status + ")",
      "outcome-" + entry.outcome);
    if (entry.problem_type) {
      const link = document.createElement("a");
      link.href = "/problems/" + entry.problem_type;
      link.textContent = "why";
      decision.appendChild(document.createTextNode(" "));
      decision.appendChild(link);
    }
    // A payout leaves for a bank account, not for a wallet.
    const where = entry.entry_point === "payout" ? " paid out to a bank account"
      : !entry.to_wallet_id ? ""
      : (entry.entry_point === "deposit" ? " deposited into " : entry.entry_point === "command" ? " by command to " : " to ")
        + walletName(entry.to_wallet_id);
    cell(tr, entry.amount_minor ? money(entry.amount_minor, lab ? "LAB" : currency) + where : "");
    cell(tr, entry.idempotency_key ? shortId(entry.idempotency_key) : "none");
    cell(tr, "instance " + instanceNumber(entry.instance_id), "instance");
    cell(tr, entry.latency_ms.toFixed(1) + " ms", "num");
    show(tr);
    tbody.insertBefore(tr, tbody.firstChild);
    const same = tbody.querySelectorAll("tr[data-money=" + tr.dataset.money + "]");
    for (let i = ROWS_PER_MONEY_MAX; i < same.length; i += 1) tbody.removeChild(same[i]);
    table.hidden = false;
    empty.hidden = true;
  }

  [filter, moneyFilter].forEach(function (select) {
    select.addEventListener("change", function () {
      Array.prototype.forEach.call(tbody.children, show);
    });
  });

  // Real transfers and race-lab requests are two streams, each with its
  // own cap, so that a lab burst never pushes a real decision out of
  // Redis; the page reads both and shows them in one table.
  function follow(source) {
    return fetch("/api/v1/decisions?limit=50&source=" + source, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : { items: [] }))
      .then(function (page) {
        const after = page.last_id ? "&after=" + encodeURIComponent(page.last_id) : "";
        const events = new EventSource("/api/v1/decisions/stream?source=" + source + after);
        events.onopen = function () { status.textContent = "live"; };
        events.onerror = function () { status.textContent = "reconnecting…"; };
        events.addEventListener("decision", function (event) { row(JSON.parse(event.data)); });
        // The server ends a stream when the session ends (then reconnecting
        // is pointless), or when it has lived its time or been idle (then
        // the browser reconnects by itself and resumes where it stopped).
        events.addEventListener("end", function (event) {
          if (JSON.parse(event.data).reason === "token") {
            events.close();
            status.textContent = "Your session has ended. Sign in again to see new decisions.";
          }
        });
        return page.items;
      });
  }

  Promise.all([follow("real"), follow("lab")]).then(function (pages) {
    pages[0].concat(pages[1])
      .sort(function (a, b) { return a.time < b.time ? -1 : a.time > b.time ? 1 : 0; })
      .forEach(row);
  });
})();
