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

// Attention from Scratch: a figure shown well below its size opens at full size in a
// full-screen view (issue 44, item 2). A figure's full size is the width the page gives it
// (a 2x figure: half its pixels, in CSS px; Sphinx writes it as an inline style), else its
// pixels; known from the HTML, so the figure's box is reserved (its aspect ratio) before
// it loads. Below SHRUNK of that size, an "Enlarge" button sits in its own line above the
// figure's right edge, never on the figure (issue 29 had it on the corner, over legends
// and titles), and a tap on the figure does the same. The view is an overlay over the
// whole window: the figure at full size (it scrolls, and pinch-zooms, if wider than the
// screen), its caption below it, always in view, and a Close button; a tap anywhere,
// Escape or the button closes it and gives the focus back.
document.addEventListener("DOMContentLoaded", () => {
  const SHRUNK = 0.85;
  const zh = document.documentElement.lang.startsWith("zh");
  const words = zh ? { open: "放大", close: "关闭", label: "以原始大小查看此图" }
    : { open: "Enlarge", close: "Close", label: "Show this figure at full size" };
  // One button per box: a static figure's <figure>, or a slider's frames (one shown at a
  // time). Sphinx wraps a figure with a given size in a link to its file: a tap opens the
  // view instead.
  const boxOf = (img) => img.closest("a.image-reference")?.parentElement ?? img.parentElement;
  const full = (img) => parseFloat(img.style.width) || +img.getAttribute("width")
    || img.naturalWidth;
  // The figure's caption: its <figcaption>, or a slider's caption paragraph after its cell.
  const captionOf = (box) => {
    const own = box.closest("figure")?.querySelector("figcaption");
    if (own) return own;
    let next = box.closest(".cell")?.nextElementSibling;
    while (next && !next.textContent.trim()) next = next.nextElementSibling;
    return next && next.matches("p") ? next : null;
  };
  const view = (img, box, opener) => {
    const overlay = document.createElement("div");
    overlay.className = "afs-zoom-overlay";
    overlay.setAttribute("role", "dialog");
    overlay.setAttribute("aria-modal", "true");
    overlay.setAttribute("aria-label", img.alt || words.label);
    const bar = document.createElement("div");
    bar.className = "afs-zoom-bar";
    const close = document.createElement("button");
    close.type = "button";
    close.className = "afs-zoom-close";
    close.textContent = `✕ ${words.close}`;
    bar.appendChild(close);
    const pane = document.createElement("div");
    pane.className = "afs-zoom-pane";
    const copy = document.createElement("img");
    copy.className = "afs-zoom-image";
    copy.src = img.currentSrc || img.src;
    copy.alt = img.alt;
    copy.style.width = `${full(img)}px`;
    pane.appendChild(copy);
    overlay.append(bar, pane);
    const caption = captionOf(box);
    if (caption) {
      const text = document.createElement("div");
      text.className = "afs-zoom-caption";
      text.innerHTML = caption.innerHTML;
      text.querySelectorAll("a.headerlink").forEach((a) => a.remove());
      overlay.appendChild(text);
    }
    const root = document.documentElement;
    const done = () => {
      overlay.remove();
      root.classList.remove("afs-zoom-open");
      document.removeEventListener("keydown", key, true);
      opener.focus({ preventScroll: true });
    };
    const key = (event) => {
      if (event.key === "Escape") { event.preventDefault(); done(); }
      if (event.key === "Tab") { event.preventDefault(); close.focus(); }  // the one control
    };
    overlay.addEventListener("click", done);  // a tap anywhere, the button included
    document.addEventListener("keydown", key, true);
    root.classList.add("afs-zoom-open");
    document.body.appendChild(overlay);
    close.focus({ preventScroll: true });
  };
  const mark = (box) => {
    const imgs = [...box.querySelectorAll(":scope > img, :scope > a.image-reference > img")];
    const shown = () => imgs.find((i) => i.getBoundingClientRect().width > 0) || imgs[0];
    imgs.forEach((img) => {
      const w = parseFloat(img.style.width);
      const h = parseFloat(img.style.height);
      if (w && h) img.style.aspectRatio = `${w} / ${h}`;
    });
    const shrunk = () => shown().getBoundingClientRect().width < SHRUNK * full(shown());
    const cue = document.createElement("button");
    cue.type = "button";
    cue.className = "afs-zoom-cue";
    cue.setAttribute("aria-label", words.label);
    cue.setAttribute("aria-haspopup", "dialog");
    cue.textContent = `⤢ ${words.open}`;
    cue.hidden = true;
    box.classList.add("afs-zoom-box");
    box.insertBefore(cue, box.firstChild);  // its own line, above the figure
    const update = () => {
      const zoomable = shrunk();
      imgs.forEach((img) => img.classList.toggle("afs-zoomable", zoomable));
      cue.hidden = !zoomable;
    };
    const open = (event) => {
      if (!shown().classList.contains("afs-zoomable")) return;
      event.preventDefault();  // not the image-reference link to the file
      view(shown(), box, cue);
    };
    update();
    imgs.forEach((img) => {
      if (!img.complete) img.addEventListener("load", update);
      img.addEventListener("click", open);
    });
    window.addEventListener("resize", update);
    box.closest(".afs-explorer")?.addEventListener("input", update);
    cue.addEventListener("click", open);
  };
  const boxes = new Set();
  document.querySelectorAll(".bd-article .cell_output img").forEach((i) => boxes.add(boxOf(i)));
  boxes.forEach(mark);
});

// The sliders (attention_lib's kernel-free explorers) show a mark at each of their stops
// (issue 29, item 2): a <datalist> of the slider's values, which the browser draws as ticks.
// Their label shows the value ("step = 23"); the stop is only a muted "(12 of 33)" beside
// the slider (issue 44, item 5; the explorer writes "12 / 33", which read as a second value).
document.addEventListener("DOMContentLoaded", () => {
  const zh = document.documentElement.lang.startsWith("zh");
  const stop = (slider) => {
    const at = +slider.value - +slider.min + 1;
    const of = +slider.max - +slider.min + 1;
    return zh ? `（第 ${at} 档，共 ${of} 档）` : `(${at} of ${of})`;
  };
  document.querySelectorAll(".afs-explorer input.afs-slider").forEach((slider) => {
    const position = slider.parentNode.querySelector(".afs-position");
    if (!position || +slider.max - +slider.min === 1) return;  // a toggle (below)
    const show = () => { position.textContent = stop(slider); };
    show();
    slider.addEventListener("input", show);  // after the explorer's own oninput
  });
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

// A slider with two stops is an either/or choice (chapter 14's layout: contiguous or
// zigzag): it is shown as a toggle of two buttons named by the two values (issue 44, item
// 5). The slider stays in the page, hidden, and the toggle moves it (its input event shows
// the frame and the label, as a drag would). Each value's name is the part in which the
// labels of its two frames differ ("step = 1, layout = contiguous" / "... = zigzag"), else
// its stop number. The buttons form a radio group: arrow keys switch, Tab leaves it.
document.addEventListener("DOMContentLoaded", () => {
  const word = /[\p{L}\p{N}_]/u;
  const differ = (a, b) => {
    let start = 0;
    while (start < a.length && start < b.length && a[start] === b[start]) start++;
    while (start > 0 && word.test(a[start - 1]) && (word.test(a[start] ?? "")
      || word.test(b[start] ?? ""))) start--;  // whole words
    let end = 0;
    while (end < a.length - start && end < b.length - start
      && a[a.length - 1 - end] === b[b.length - 1 - end]) end++;
    while (end > 0 && word.test(a[a.length - end]) && (word.test(a[a.length - 1 - end] ?? "")
      || word.test(b[b.length - 1 - end] ?? ""))) end--;
    return [a.slice(start, a.length - end).trim(), b.slice(start, b.length - end).trim()];
  };
  let count = 0;
  document.querySelectorAll(".afs-explorer").forEach((explorer) => {
    const sliders = [...explorer.querySelectorAll("input.afs-slider")];
    const frameAt = (slider, value) => {  // row-major over the sliders, as the explorer
      let index = 0;
      for (const s of sliders) index = index * (+s.max + 1) + (s === slider ? value : +s.value);
      return explorer.querySelector(`img.afs-frame[data-index="${index}"]`);
    };
    sliders.filter((s) => +s.max - +s.min === 1).forEach((slider) => {
      const control = slider.closest(".afs-control");
      const labels = [0, 1].map((v) => frameAt(slider, +slider.min + v)?.dataset.label ?? "");
      let names = differ(...labels);
      if (!names[0] || !names[1] || names.some((n) => n.length > 24)) names = ["1", "2"];
      const toggle = document.createElement("div");
      toggle.className = "afs-control afs-toggle";
      const name = document.createElement("span");
      name.className = "afs-name";
      name.id = `afs-toggle-${count++}`;
      name.textContent = slider.dataset.param;
      const group = document.createElement("div");
      group.className = "afs-toggle-group";
      group.setAttribute("role", "radiogroup");
      group.setAttribute("aria-labelledby", name.id);
      const buttons = names.map((text, v) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "afs-toggle-option";
        button.setAttribute("role", "radio");
        button.dataset.value = String(+slider.min + v);
        button.textContent = text;
        group.appendChild(button);
        return button;
      });
      const show = () => buttons.forEach((b) => {
        const on = b.dataset.value === slider.value;
        b.setAttribute("aria-checked", String(on));
        b.tabIndex = on ? 0 : -1;
      });
      const choose = (button) => {
        if (slider.value !== button.dataset.value) {
          slider.value = button.dataset.value;
          slider.dispatchEvent(new Event("input", { bubbles: true }));
        }
        show();
      };
      buttons.forEach((button, v) => {
        button.addEventListener("click", () => choose(button));
        button.addEventListener("keydown", (event) => {
          if (!["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"].includes(event.key)) return;
          event.preventDefault();
          const other = buttons[1 - v];
          choose(other);
          other.focus();
        });
      });
      toggle.append(name, group);
      control.after(toggle);
      control.hidden = true;
      control.classList.add("afs-toggled");
      show();
      slider.addEventListener("input", show);
    });
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

// A code block, output or result table wider than its column (on a phone) scrolls in its
// own box: it is marked `afs-scrolls`, and `afs-scroll-end` once scrolled to its end, so
// that afs.css fades its right edge only while there is more to see. Checked again whenever its size changes
// (a window turned, a hidden cell opened).
document.addEventListener("DOMContentLoaded", () => {
  const check = (pre) => {
    const scrolls = pre.scrollWidth > pre.clientWidth + 1;
    pre.classList.toggle("afs-scrolls", scrolls);
    pre.classList.toggle("afs-scroll-end",
      scrolls && pre.scrollLeft + pre.clientWidth >= pre.scrollWidth - 1);
  };
  const resized = new ResizeObserver((entries) => entries.forEach((e) => check(e.target)));
  // a result table's box (attention_lib.show.table) too: its right-hand columns fade out
  document.querySelectorAll(".bd-article pre, .bd-article div.afs-table").forEach((pre) => {
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

// Issue 44, item 9: the download menu links to the page's PDF and to the whole book's,
// which `make pdf` prints into the edition's pdf/ folder (tools/build_book.py), beside the
// theme's own ".pdf" entry (the browser's print dialog).
document.addEventListener("DOMContentLoaded", () => {
  const menu = document.querySelector(".dropdown-download-buttons ul, "
    + "[aria-label='Download this page'] + ul, .dropdown-download-buttons .dropdown-menu");
  const rootAttr = document.documentElement.dataset.content_root;
  if (!menu || rootAttr === undefined) return;
  const root = new URL(rootAttr, location.href);
  const page = location.pathname.startsWith(root.pathname)
    ? location.pathname.slice(root.pathname.length).replace(/\.html$/, "") : null;
  if (!page) return;
  const zh = document.documentElement.lang.startsWith("zh");
  const entries = [
    [`pdf/${page}.pdf`, zh ? "本章 PDF" : "PDF of this page"],
    [zh ? "pdf/attention-from-scratch-zh.pdf" : "pdf/attention-from-scratch.pdf",
      zh ? "全书 PDF" : "PDF of the book"],
  ];
  for (const [href, text] of entries) {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = new URL(href, root).href;
    link.className = "btn btn-sm dropdown-item afs-pdf-link";
    link.textContent = text;
    link.setAttribute("download", "");
    item.appendChild(link);
    menu.appendChild(item);
  }
});

// The chapter list's toggles: a page with sub-pages (the API reference) opens with a
// <summary> that holds only an icon. It gets a name, for screen readers (axe-core's
// summary-name rule): the page whose sub-pages it shows.
document.addEventListener("DOMContentLoaded", () => {
  const zh = document.documentElement.lang.startsWith("zh");
  for (const summary of document.querySelectorAll("details > summary")) {
    if (summary.textContent.trim() || summary.hasAttribute("aria-label")) continue;
    const link = summary.closest("li")?.querySelector(":scope > a");
    const page = link ? link.textContent.trim() : "";
    summary.setAttribute("aria-label", zh ? `${page}：展开或收起子页面` : `Pages under ${page}`);
  }
});

// A wide table (attention_lib.show.table) scrolls sideways in its box on a phone: the box
// takes the keyboard focus, so that it scrolls without a mouse (axe-core's
// scrollable-region-focusable), and is named by the table's caption.
document.addEventListener("DOMContentLoaded", () => {
  for (const box of document.querySelectorAll("div.afs-table")) {
    if (box.hasAttribute("tabindex")) continue;
    box.tabIndex = 0;
    box.setAttribute("role", "region");
    const caption = box.querySelector("caption");
    if (caption) box.setAttribute("aria-label", caption.textContent.trim());
  }
});
