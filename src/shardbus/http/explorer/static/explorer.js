// shardbus explorer: periodic refresh of live panels, confirmations, and "select all". No dependencies.
"use strict";

function refreshPanel(panel) {
  const seconds = Number(panel.dataset.refreshSeconds || 3);
  const tick = async () => {
    if (!document.hidden) {
      try {
        const response = await fetch(panel.dataset.refreshUrl, { credentials: "same-origin", cache: "no-store" });
        if (response.status === 401) { window.location.reload(); return; }
        if (response.ok) {
          panel.innerHTML = await response.text();
          panel.dataset.refreshed = String(Date.now());
        }
      } catch (e) { /* the broker is restarting: try again at the next tick */ }
    }
    window.setTimeout(tick, seconds * 1000);
  };
  window.setTimeout(tick, seconds * 1000);
}

function confirmForms() {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); return; }
      const confirmed = form.querySelector("input[name=confirmed]");
      if (confirmed) confirmed.value = "yes";
    });
  }
}

function selectAll() {
  for (const box of document.querySelectorAll("input[data-select-all]")) {
    box.addEventListener("change", () => {
      for (const item of box.closest("table").querySelectorAll("tbody input[type=checkbox]")) item.checked = box.checked;
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const panel of document.querySelectorAll("[data-refresh-url]")) refreshPanel(panel);
  confirmForms();
  selectAll();
});
