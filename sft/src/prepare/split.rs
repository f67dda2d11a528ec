//! An eval set held out of the train data (`--eval-split F`), split as the `datasets`
//! library's `Dataset.train_test_split(test_size=F, shuffle=False)` splits: of `n` records,
//! the last `ceil(F * n)` evaluate and the ones before them train. The split is of records
//! (the dataset's lines, elements or rows), before any is prepared, so a packed bin never
//! holds records of both sides.

/// The fraction of a dataset's records held out as its eval set, in (0, 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldOut {
    fraction: f64,
}

impl HeldOut {
    /// `fraction` of the records, or why it cannot be one.
    pub fn new(fraction: f64) -> Result<Self, String> {
        if fraction.is_finite() && fraction > 0.0 && fraction < 1.0 {
            Ok(Self { fraction })
        } else {
            Err(format!(
                "{fraction} is not a fraction of the records between 0 and 1 (exclusive)"
            ))
        }
    }

    /// The fraction held out.
    pub fn fraction(self) -> f64 {
        self.fraction
    }

    /// The index of the first eval record of `records`, or why no split of them trains
    /// and evaluates.
    pub fn first_eval_record(self, records: u64) -> Result<u64, String> {
        let eval = (self.fraction * records as f64).ceil() as u64;
        if eval >= records {
            return Err(format!(
                "an eval split of {} of {records} record(s) leaves none to train on",
                self.fraction
            ));
        }
        Ok(records - eval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_ceil_of_the_fraction_evaluates() {
        let split = HeldOut::new(0.05).expect("fraction");
        assert_eq!(split.first_eval_record(200), Ok(190));
        assert_eq!(
            split.first_eval_record(201),
            Ok(190),
            "ceil(10.05) = 11 held out"
        );
        assert_eq!(
            split.first_eval_record(2),
            Ok(1),
            "at least one record evaluates"
        );
        assert!(
            split.first_eval_record(1).is_err(),
            "one record cannot be split"
        );
        for bad in [0.0, 1.0, -0.1, f64::NAN] {
            assert!(HeldOut::new(bad).is_err(), "{bad}");
        }
    }
}
