// The episode browser: three selects over the data block; the URL hash
// (#cell=…&arm=…&seed=…) selects an episode and follows the selection.
const data = JSON.parse(document.getElementById("data").textContent);
const byId = (id) => document.getElementById(id);

function fill(select, values) {
  select.innerHTML = "";
  for (const v of values) {
    const o = document.createElement("option");
    o.value = o.textContent = String(v);
    select.appendChild(o);
  }
}

function currentCell() {
  return data.cells.find((c) => c.name === byId("cell").value);
}

function show() {
  const cell = currentCell();
  const body = byId("turns").tBodies[0];
  body.innerHTML = "";
  if (!cell) {
    byId("summary").textContent = "no episodes";
    return;
  }
  const arm = byId("arm").value;
  const seed = byId("seed").value;
  const turns = cell.episodes[arm + "|" + seed] || [];
  for (const t of turns) {
    const row = body.insertRow();
    row.className = t.channels.length ? "bad" : "ok";
    row.dataset.turn = t.turn;
    const cells = [
      t.turn,
      t.kind + (t.step ? " " + t.step : ""),
      t.request,
      t.directive,
      t.replies.join("\n---\n"),
      t.bookings.join("\n"),
      t.label,
      t.channels.length ? t.channels.join(", ") : "correct",
    ];
    for (const v of cells) {
      row.insertCell().textContent = String(v);
    }
  }
  const bad = turns.filter((t) => t.channels.length).length;
  byId("summary").textContent =
    cell.name + " · " + arm + " · seed " + seed + ": " + turns.length +
    " turns, " + bad + " with a violation";
  const hash = "#cell=" + encodeURIComponent(cell.name) + "&arm=" +
    encodeURIComponent(arm) + "&seed=" + encodeURIComponent(seed);
  if (location.hash !== hash) {
    history.replaceState(null, "", hash);
  }
}

function chooseCell() {
  const cell = currentCell();
  fill(byId("arm"), cell ? cell.arms : []);
  fill(byId("seed"), cell ? cell.seeds : []);
}

function choose(select, value) {
  if (value !== undefined && [...select.options].some((o) => o.value === value)) {
    select.value = value;
  }
}

fill(byId("cell"), data.cells.map((c) => c.name));
const wanted = Object.fromEntries(
  location.hash.slice(1).split("&").filter((kv) => kv.includes("="))
    .map((kv) => kv.split("=").map(decodeURIComponent)),
);
choose(byId("cell"), wanted.cell);
chooseCell();
choose(byId("arm"), wanted.arm);
choose(byId("seed"), wanted.seed);
byId("cell").addEventListener("change", () => { chooseCell(); show(); });
byId("arm").addEventListener("change", show);
byId("seed").addEventListener("change", show);
show();
