// The live feed: recent decisions, then new ones pushed over Server-Sent
// Events from every instance.
(function () {
  "use strict";
  const tbody = document.querySelector("#feed tbody");
  const status = document.getElementById("feed-status");

  function row(entry) {
    const tr = document.createElement("tr");
    const time = new Date(entry.time).toLocaleTimeString();
    [time, entry.instance_id, entry.layer, entry.outcome.replace(/_/g, " "), String(entry.status), entry.latency_ms.toFixed(1) + " ms"]
      .forEach(function (text, c) {
        const td = document.createElement("td");
        td.textContent = text;
        if (c === 3) td.className = "outcome-" + entry.outcome;
        if (c === 5) td.className = "num";
        tr.appendChild(td);
      });
    tbody.insertBefore(tr, tbody.firstChild);
    while (tbody.children.length > 200) tbody.removeChild(tbody.lastChild);
  }

  fetch("/api/v1/decisions?limit=50", { credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : { items: [] }))
    .then(function (page) {
      page.items.forEach(row);
      const after = page.last_id ? "?after=" + encodeURIComponent(page.last_id) : "";
      const source = new EventSource("/api/v1/decisions/stream" + after);
      source.onopen = function () { status.textContent = "live"; };
      source.onerror = function () { status.textContent = "reconnecting…"; };
      source.addEventListener("decision", function (event) { row(JSON.parse(event.data)); });
      // The server ends a stream when the session ends (then reconnecting
      // is pointless) or when it has lived its time (then the browser
      // reconnects by itself and resumes where it stopped).
      source.addEventListener("end", function (event) {
        if (JSON.parse(event.data).reason === "token") {
          source.close();
          status.textContent = "Your session has ended. Sign in again to see new decisions.";
        }
      });
    });
})();
