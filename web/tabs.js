// The tabs: each is a button in <nav id="tabs"> and a <main data-tab="..."> panel. Adding a tab is adding
// both; this module shows the panel of the button pressed.

export function setUpTabs() {
  const buttons = [...document.querySelectorAll("#tabs [data-tab]")];
  const show = (name) => {
    for (const button of buttons) button.setAttribute("aria-selected", String(button.dataset.tab === name));
    for (const panel of document.querySelectorAll("main[data-tab]")) panel.hidden = panel.dataset.tab !== name;
  };
  for (const button of buttons) button.addEventListener("click", () => show(button.dataset.tab));
  show(buttons.find((b) => b.getAttribute("aria-selected") === "true")?.dataset.tab ?? buttons[0]?.dataset.tab);
}
