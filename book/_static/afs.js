// Attention from Scratch: the book's own script (loaded in <head>, after MathJax's config).

// Stable layout (issue 29, item 6). MathJax typesets a page's formulas about a second after
// it is first shown, and each formula then takes a different room than its TeX source did:
// the text below jumps (a layout shift of up to 0.23 on a desktop). No build-time renderer
// of TeX is available offline here, and the room a formula takes is not known before
// MathJax has laid it out, so the article of a page with formulas is shown only once they
// are typeset (afs.css: html.afs-typesetting); the header and the chapter list show at
// once. At most 3 s: if MathJax fails, the page is shown with its TeX source. Without
// JavaScript nothing is hidden.
if (window.MathJax) {
  const root = document.documentElement;
  const show = () => root.classList.remove("afs-typesetting");
  root.classList.add("afs-typesetting");
  const startup = (window.MathJax.startup = window.MathJax.startup || {});
  const ready = startup.pageReady;
  startup.pageReady = () => {
    const done = ready ? ready() : window.MathJax.startup.defaultPageReady();
    return Promise.resolve(done).finally(show);
  };
  setTimeout(show, 3000);
}

// Attention from Scratch: a figure shrunk to fit a narrow column opens at full size
// (scrolling inside its own output box) when tapped, and closes on a second tap. A button
// on its corner says so (issue 29, item 1: a visible cue) and does the same by keyboard.
// A figure's full size is the width the page gives it (a 2x figure: half its pixels, in
// CSS px; Sphinx writes it as an inline style), else its pixels; known from the HTML, so
// the cue is placed, and the figure's box reserved (its aspect ratio), before it loads.
document.addEventListener("DOMContentLoaded", () => {
  const zh = document.documentElement.lang.startsWith("zh");
  const words = zh ? { open: "放大", close: "缩小", label: "以原始大小查看此图" }
    : { open: "Enlarge", close: "Fit", label: "Show this figure at full size" };
  // One cue per box: a static figure's <figure>, or a slider's frames (one shown at a time).
  // Sphinx wraps a figure with a given size in a link to its file: a tap zooms instead.
  const boxOf = (img) => img.closest("a.image-reference")?.parentElement ?? img.parentElement;
  const mark = (box) => {
    const imgs = [...box.querySelectorAll(":scope > img, :scope > a.image-reference > img")];
    const shown = () => imgs.find((i) => i.getBoundingClientRect().width > 0) || imgs[0];
    const full = (img) => parseFloat(img.style.width) || +img.getAttribute("width")
      || img.naturalWidth;
    imgs.forEach((img) => {
      const w = parseFloat(img.style.width);
      const h = parseFloat(img.style.height);
      if (w && h) img.style.aspectRatio = `${w} / ${h}`;
    });
    const shrunk = () => full(shown()) > shown().getBoundingClientRect().width + 1;
    const cue = document.createElement("button");
    cue.type = "button";
    cue.className = "afs-zoom-cue";
    cue.setAttribute("aria-label", words.label);
    cue.hidden = true;
    box.classList.add("afs-zoom-box");
    box.appendChild(cue);
    const update = () => {
      const zoomed = box.classList.contains("afs-zoomed");
      const zoomable = zoomed || shrunk();
      imgs.forEach((img) => img.classList.toggle("afs-zoomable", zoomable));
      cue.hidden = !zoomable;
      cue.textContent = zoomed ? `⤡ ${words.close}` : `⤢ ${words.open}`;
      cue.setAttribute("aria-pressed", String(zoomed));
    };
    const toggle = (event) => {
      if (!shown().classList.contains("afs-zoomable")) return;
      event.preventDefault();  // not the image-reference link to the file
      box.classList.toggle("afs-zoomed");
      update();
    };
    update();
    imgs.forEach((img) => {
      if (!img.complete) img.addEventListener("load", update);
      img.addEventListener("click", toggle);
    });
    window.addEventListener("resize", update);
    box.closest(".afs-explorer")?.addEventListener("input", update);
    cue.addEventListener("click", toggle);
  };
  const boxes = new Set();
  document.querySelectorAll(".bd-article .cell_output img").forEach((i) => boxes.add(boxOf(i)));
  boxes.forEach(mark);
});

// The sliders (attention_lib's kernel-free explorers) show a mark at each of their stops
// (issue 29, item 2): a <datalist> of the slider's values, which the browser draws as ticks.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".afs-explorer input.afs-slider").forEach((slider, n) => {
    const list = document.createElement("datalist");
    list.id = `afs-stops-${n}`;
    for (let v = +slider.min; v <= +slider.max; v++) {
      const option = document.createElement("option");
      option.value = String(v);
      list.appendChild(option);
    }
    slider.after(list);
    slider.setAttribute("list", list.id);
  });
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

// Search (issue 29, item 5): result snippets show prose. Sphinx's search page makes each
// snippet from the text of the page's main block (Search.htmlToText, which drops only the
// headings' "#" links): the table of contents of the intro, code, outputs and the TeX
// source of every formula came out as text. They are dropped first; an inline formula
// keeps a plain reading of its TeX ("d_k", "1/sqrt d_k"); runs of white space become one.
document.addEventListener("DOMContentLoaded", () => {
  // searchtools.js declares `const Search`: a global binding, not a property of window
  const search = typeof Search === "undefined" ? null : Search;  // eslint-disable-line no-undef
  if (!search || typeof search.htmlToText !== "function") return;
  const original = search.htmlToText;
  const symbols = { top: "ᵀ", cdot: "·", times: "×", sqrt: "√", infty: "∞", le: "≤", ge: "≥",
    ell: "ℓ", in: "∈", sum: "∑", to: "→", alpha: "α", beta: "β", theta: "θ", omega: "ω",
    sigma: "σ", tau: "τ", lambda: "λ", mu: "μ", pi: "π", delta: "δ" };
  const plain = (tex) => tex.replace(/^\\\(|\\\)$/g, "")
    .replace(/\\(text|mathrm|operatorname|mathbf|mathit|left|right|big|Big)\b/g, "")
    .replace(/\\([A-Za-z]+)/g, (m, name) => symbols[name] ?? `${name} `)
    .replace(/[{}]|\\[,;!]/g, "").replace(/\^ᵀ/g, "ᵀ").replace(/\s+/g, " ").trim();
  search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(["nav", "#jb-print-toc", ".bd-header-article", ".bd-sidebar-secondary", ".page-toc",
      ".prev-next-area", ".bd-footer-article", ".toctree-wrapper", "div.math", ".cell_input",
      ".cell_output",
      "div.highlight", "pre", "table", "figure", ".footnote", ".citation"].join(", "))
      .forEach((e) => e.remove());
    doc.querySelectorAll("span.math").forEach((m) => {
      m.textContent = plain(m.textContent);
    });
    return original(doc.documentElement.outerHTML, anchor).replace(/\s+/g, " ");
  };
});
