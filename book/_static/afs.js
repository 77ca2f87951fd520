// Attention from Scratch: a figure shrunk to fit a narrow column opens at full size
// (scrolling inside its own output box) when tapped, and closes on a second tap.
document.addEventListener("DOMContentLoaded", () => {
  const mark = (img) => {
    const shrunk = () => img.naturalWidth > img.getBoundingClientRect().width + 1;
    const update = () => img.classList.toggle("afs-zoomable", shrunk() ||
      img.parentElement.classList.contains("afs-zoomed"));
    if (img.complete) update(); else img.addEventListener("load", update);
    window.addEventListener("resize", update);
    img.addEventListener("click", () => {
      if (!img.classList.contains("afs-zoomable")) return;
      img.parentElement.classList.toggle("afs-zoomed");
    });
  };
  document.querySelectorAll(".bd-article .cell_output img").forEach(mark);
});

// The language switch keeps the reader's place: its link to the same page in the other
// edition (book/_ext/afs_site.py, _templates/language-switch.html) gets the section being
// read as its #fragment. The editions share their section ids (Sphinx makes them from the
// English titles before it translates them). The place is the URL's own #fragment until
// the reader scrolls away from it, then the innermost section whose heading has scrolled
// past the top quarter of the window; at the top of the page there is none.
// Arriving at a #fragment, the browser jumps before the formulas are typeset and the
// figures loaded, which push the section down the page: once MathJax is done, the page
// jumps to it again (unless the reader has scrolled meanwhile).
document.addEventListener("DOMContentLoaded", () => {
  const link = document.querySelector("a.afs-language-switch");
  const target = () => {
    const id = decodeURIComponent(window.location.hash.slice(1));
    return id ? document.getElementById(id) : null;
  };
  let scrolledByReader = false;
  const reader = () => { scrolledByReader = true; };
  window.addEventListener("wheel", reader, { passive: true });
  window.addEventListener("touchmove", reader, { passive: true });
  window.addEventListener("keydown", (e) => {
    if (["PageUp", "PageDown", "ArrowUp", "ArrowDown", "Home", "End", " "].includes(e.key)) {
      reader();
    }
  });
  window.addEventListener("pointerdown", (e) => {  // the page's scroll bar
    if (e.target === document.documentElement) reader();
  });
  window.addEventListener("load", () => {
    const typeset = window.MathJax?.startup?.promise ?? Promise.resolve();
    typeset.then(() => requestAnimationFrame(() => {
      const t = target();
      if (t && !scrolledByReader) t.scrollIntoView({ block: "start", behavior: "instant" });
    }));
  });
  if (!link) return;
  const page = link.getAttribute("href").split("#")[0];
  const onScreen = (el) => {
    const r = el.getBoundingClientRect();
    return r.bottom > 0 && r.top < window.innerHeight;
  };
  const place = () => {
    const t = target();
    if (t && (!scrolledByReader || onScreen(t))) return window.location.hash;
    const line = window.innerHeight / 4;
    const sections = [...document.querySelectorAll("article.bd-article section[id]")];
    const read = sections.filter((s) => s.getBoundingClientRect().top <= line).pop();
    // The page's own section (its H1) is the top of the page: no fragment.
    return read && read !== sections[0] ? `#${encodeURIComponent(read.id)}` : "";
  };
  const update = () => link.setAttribute("href", page + place());
  let pending = false;
  window.addEventListener("scroll", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; update(); });
  }, { passive: true });
  window.addEventListener("hashchange", () => { scrolledByReader = false; update(); });
  ["click", "auxclick", "contextmenu", "focus"].forEach((e) => link.addEventListener(e, update));
  update();
});

// A code block or output wider than its column (on a phone) scrolls in its own box: it is
// marked `afs-scrolls`, and `afs-scroll-end` once scrolled to its end, so that afs.css fades
// its right edge only while there is more to see. Checked again whenever its size changes
// (a window turned, a hidden cell opened).
document.addEventListener("DOMContentLoaded", () => {
  const check = (pre) => {
    const scrolls = pre.scrollWidth > pre.clientWidth + 1;
    pre.classList.toggle("afs-scrolls", scrolls);
    pre.classList.toggle("afs-scroll-end",
      scrolls && pre.scrollLeft + pre.clientWidth >= pre.scrollWidth - 1);
  };
  const resized = new ResizeObserver((entries) => entries.forEach((e) => check(e.target)));
  document.querySelectorAll(".bd-article pre").forEach((pre) => {
    resized.observe(pre);
    pre.addEventListener("scroll", () => check(pre), { passive: true });
  });
});
