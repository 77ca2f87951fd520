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
