//! Reports over run directories: [`aggregate`] sums each arm's episodes
//! into the paper's tables (strict success with Wilson 95% intervals,
//! adjacent-rung exact McNemar with Holm, channels, accounting, obedience,
//! compile accuracy); [`mod@render`] writes them as text, Markdown, CSV or JSON;
//! [`figures`] draws the paper's figures as SVG; [`html`] puts tables,
//! figures and an episode browser in one self-contained page.

pub mod aggregate;
pub mod figures;
pub mod html;
pub mod render;

pub use aggregate::{build, Report};
pub use render::{render, Format};
