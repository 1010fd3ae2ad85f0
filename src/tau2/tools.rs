//! τ²'s airline tools over a [`FlightDb`](super::db::FlightDb).

/// τ²'s frozen "now" (EST): reservations booked get it as `created_at`.
pub const NOW: &str = "2024-05-15T15:00:00";

/// The six tools that change the database.
pub const WRITES: [&str; 6] = [
    "book_reservation",
    "cancel_reservation",
    "update_reservation_baggages",
    "update_reservation_flights",
    "update_reservation_passengers",
    "send_certificate",
];

pub fn is_write(name: &str) -> bool {
    WRITES.contains(&name)
}
