//! The one renderer: a [`super::Figure`] drawn once as SVG, written as SVG, PNG (rasterised from
//! it by `resvg`) and PDF (vector, by `svg2pdf`, its fonts embedded).

use super::*;

static FONTS: Once = Once::new();

/// Registers the embedded font under the family name plotters asks for by default.
pub fn register_fonts() {
    FONTS.call_once(|| {
        for family in ["sans-serif", "DejaVu Sans"] {
            let _ = plotters::style::register_font(family, FontStyle::Normal, dejavu::sans::regular());
            let _ = plotters::style::register_font(family, FontStyle::Bold, dejavu::sans::bold());
        }
    });
}

/// An SVG drawing parsed as usvg lays it out: text shaped (kerning included) with the embedded
/// DejaVu Sans, the family plotters' `sans-serif` is mapped to.
pub(super) fn svg_tree(svg: &str, origin: &Path) -> Result<svg2pdf::usvg::Tree> {
    use svg2pdf::usvg;
    static DB: std::sync::OnceLock<std::sync::Arc<usvg::fontdb::Database>> = std::sync::OnceLock::new();
    let db = DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_data(dejavu::sans::regular().to_vec());
        db.load_font_data(dejavu::sans::bold().to_vec());
        db.set_sans_serif_family("DejaVu Sans");
        std::sync::Arc::new(db)
    });
    let options = usvg::Options { font_family: "DejaVu Sans".into(), fontdb: db.clone(), ..Default::default() };
    usvg::Tree::from_str(svg, &options).map_err(|e| anyhow!("{}: {e}", origin.display()))
}

/// The SVG drawing (parsed: [`svg_tree`]) as a vector PDF, its fonts subset into it, its page `PDF_DPI` pixels to
/// the inch (what pdflatex's `\includegraphics` takes).
pub(super) fn svg_to_pdf(tree: &svg2pdf::usvg::Tree, origin: &Path) -> Result<Vec<u8>> {
    svg2pdf::to_pdf(tree, svg2pdf::ConversionOptions::default(), svg2pdf::PageOptions { dpi: PDF_DPI })
        .map_err(|e| anyhow!("{}: converting to PDF: {e}", origin.display()))
}

/// The SVG drawing (parsed: [`svg_tree`]) rasterised by resvg into PNG bytes of `size` pixels: the PNG is the SVG
/// as drawn, its text placed by the same shaping (plotters' own bitmap text drops each glyph's
/// left side bearing, so kerned pairs such as the "Tr" of "Training" overprint).
pub(super) fn svg_to_png(tree: &svg2pdf::usvg::Tree, (w, h): (u32, u32), origin: &Path) -> Result<Vec<u8>> {
    let mut pixmap = resvg::tiny_skia::Pixmap::new(w, h).ok_or_else(|| anyhow!("a canvas of {w}×{h} pixels"))?;
    resvg::render(tree, resvg::tiny_skia::Transform::identity(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| anyhow!("{}: encoding the PNG: {e}", origin.display()))
}

/// The SVG file of a drawing (parsed: [`svg_tree`]): its text as the embedded font's outlines,
/// as matplotlib's `svg.fonttype: path` writes it, so that it looks the same on a machine
/// without DejaVu Sans (the drawing's `<text>` names `sans-serif`, which a viewer would
/// substitute). Coordinates to a hundredth of a drawing unit (1/17,800 in).
pub(super) fn svg_with_outlines(tree: &svg2pdf::usvg::Tree) -> String {
    let options =
        svg2pdf::usvg::WriteOptions { coordinates_precision: 2, transforms_precision: 4, ..Default::default() };
    tree.to_string(&options)
}

/// `draw` on an SVG canvas of `size` drawing units: the one drawing every format is made from, so
/// that what the layout test checks in the SVG is what the PNG and the PDF show.
pub(super) fn draw_svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<()>,
) -> Result<String> {
    register_fonts();
    let mut drawing = String::new();
    {
        let root = SVGBackend::with_string(&mut drawing, size).into_drawing_area();
        draw(&root)?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(drawing)
}

/// Writes the SVG `drawing` of `size` pixels as `<out_base>.png` (rasterised), `.svg` and `.pdf`
/// (vector), each as `want` asks; returns the paths written. Each file is written to a temporary
/// file and renamed into place: a full disk or a crash leaves the previous figure, never a
/// truncated one.
pub(super) fn write_formats(drawing: &str, size: (u32, u32), want: Formats, out_base: &Path) -> Result<Vec<PathBuf>> {
    let (png, svg, pdf) =
        (out_base.with_extension("png"), out_base.with_extension("svg"), out_base.with_extension("pdf"));
    let mut written = Vec::new();
    // Parsed (text shaped with the embedded font) once for every format.
    let tree = svg_tree(drawing, &svg)?;
    if want.png {
        crate::run_dir::atomic_write(&png, &svg_to_png(&tree, size, &png)?)?;
        written.push(png);
    }
    if want.svg {
        crate::run_dir::atomic_write(&svg, svg_with_outlines(&tree).as_bytes())?;
        written.push(svg);
    }
    if want.pdf {
        crate::run_dir::atomic_write(&pdf, &svg_to_pdf(&tree, &pdf)?)?;
        written.push(pdf);
    }
    Ok(written)
}
