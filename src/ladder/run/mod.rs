//! Running episodes: one episode on one arm, a cell of them into a run
//! directory, reading run logs back (with the trap-turn probe over their
//! turns), and replaying recorded replies; [`resolve`] takes a grid's (or
//! one cell's) settings to running cells.

pub mod cell;
pub mod grid;
pub mod replay;
pub mod resolve;
pub mod runlog;
pub mod runner;
pub mod trap;
