// The race lab's form. The server fires the burst; this script only sets a
// preset's switches when it is picked, says that a run is going, and moves
// focus to the result once the page comes back with one.
(function () {
  "use strict";
  const form = document.getElementById("lab");
  const summary = document.getElementById("summary");
  if (summary) summary.focus();
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
