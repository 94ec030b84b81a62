// tuneplan: the little JavaScript the pages use (no libraries, nothing fetched).
// 1. Click a column heading of a .sortable table to sort it (again to reverse).
// 2. Plan form: show the LoRA/quantization fields only for the methods that use them.
"use strict";

function sortTable(table, col, button) {
  const body = table.tBodies[0];
  const rows = Array.from(body.rows).filter((r) => r.cells.length > col);
  const ascending = button.getAttribute("aria-sort") !== "ascending";
  const numeric = table.tHead.rows[0].cells[col].classList.contains("num");
  const key = (row) => row.cells[col].dataset.sort ?? row.cells[col].textContent;
  rows.sort((a, b) => {
    let x = key(a), y = key(b);
    if (numeric) {
      // Empty (no price) sorts last in either direction.
      if (x === "" || y === "") return (x === "") - (y === "");
      x = parseFloat(x); y = parseFloat(y);
      return ascending ? x - y : y - x;
    }
    return ascending ? x.localeCompare(y) : y.localeCompare(x);
  });
  for (const other of table.tHead.querySelectorAll("button[aria-sort]")) {
    other.removeAttribute("aria-sort");
    other.parentElement.removeAttribute("aria-sort");
  }
  const state = ascending ? "ascending" : "descending";
  button.setAttribute("aria-sort", state);
  button.parentElement.setAttribute("aria-sort", state);
  body.append(...rows);
}

function toggleMethodFields(form) {
  const method = form.elements.method.value;
  const lora = ["lora", "dora", "qlora", "lora8bit", "auto"].includes(method);
  for (const el of form.querySelectorAll("[data-lora]")) el.hidden = !lora;
  for (const el of form.querySelectorAll("[data-quant]")) el.hidden = !["qlora", "auto"].includes(method);
}

document.addEventListener("DOMContentLoaded", () => {
  for (const table of document.querySelectorAll("table.sortable")) {
    for (const button of table.tHead.querySelectorAll("button[data-col]")) {
      button.addEventListener("click", () => sortTable(table, Number(button.dataset.col), button));
    }
  }
  const form = document.querySelector("form.job");
  if (form) {
    form.elements.method.addEventListener("change", () => toggleMethodFields(form));
    toggleMethodFields(form);
    form.addEventListener("submit", () => {
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      button.textContent = "Planning…";
    });
  }
});
