// After a cooldown refusal the Send button waits until the window has passed:
// the button and the notice's last sentence count down together from one
// timer, then the button works again. Without JavaScript the page says when.
(function () {
  "use strict";
  const button = document.querySelector("button[data-wait-s]");
  const line = document.getElementById("countdown");
  if (!button) return;
  let left = parseInt(button.dataset.waitS, 10) || 0;
  const label = button.textContent;
  function tick() {
    if (left <= 0) {
      button.disabled = false;
      button.textContent = label;
      if (line) line.textContent = "You can send now.";
      return;
    }
    button.disabled = true;
    button.textContent = label + " (" + left + " s)";
    if (line) line.textContent = "Try again in " + left + " s.";
    left -= 1;
    setTimeout(tick, 1000);
  }
  tick();
})();
