// The race lab's forms. The server fires the bursts; this script only sets
// a preset's switches when it is picked, picks the burst that reaches a
// layer chosen for comparison, says that a run is going, moves focus to
// the result once the page comes back with one, and tells a timeline mark's
// request when it is tapped or focused (a touch screen has no hover).
(function () {
  "use strict";
  const summary = document.getElementById("summary");
  if (summary) summary.focus();
  const detail = document.getElementById("mark-detail");
  if (detail) {
    const tell = function (event) {
      const mark = event.target.closest ? event.target.closest(".mark") : null;
      if (mark && mark.dataset.title) detail.textContent = mark.dataset.title + ".";
    };
    document.querySelectorAll("figure.timeline svg").forEach(function (svg) {
      svg.addEventListener("click", tell);
      svg.addEventListener("focusin", tell);
    });
  }
  const compare = document.getElementById("compare-form");
  if (compare) {
    const layer = document.getElementById("compared");
    layer.addEventListener("change", function () {
      document.getElementById("compare-preset").value = layer.selectedOptions[0].dataset.preset;
    });
    compare.addEventListener("submit", function () {
      const count = document.getElementById("compare-count").value;
      const runs = layer.selectedOptions[0].dataset.runs;
      document.getElementById("compare-fire").disabled = true;
      document.getElementById("compare-progress").textContent =
        "Firing " + count + " requests at once at each of " + runs +
        " alternatives in turn and checking the database after each. This takes a few seconds.";
    });
  }
  const form = document.getElementById("lab");
  if (!form) return;
  form.querySelectorAll("input[name=preset]").forEach(function (radio) {
    radio.addEventListener("change", function () {
      const cooldown = document.getElementById("switch-cooldown");
      if (!cooldown.disabled) cooldown.value = radio.dataset.cooldown === "on" ? "on" : "off";
      document.getElementById("keys").value = radio.dataset.keys;
    });
  });
  form.addEventListener("submit", function () {
    const count = document.getElementById("count").value;
    document.getElementById("fire").disabled = true;
    document.getElementById("lab-progress").textContent =
      "Firing " + count + " requests at once and checking the database. This takes a few seconds.";
  });
})();
