//! Test harness: finds the built artifacts and runs programs against the simulated driver.
