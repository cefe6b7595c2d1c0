//! Runs of consecutive pool rows: how the rows of a lease or a receive are described to a peer
//! and counted (a run is one transfer descriptor per pool when the peer's rows are a run too).

/// `count` consecutive rows starting at `first_row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRun {
    pub first_row: u32,
    pub count: u32,
}

/// The rows in order as maximal runs of consecutive rows.
pub fn row_runs(rows: &[u32]) -> Vec<RowRun> {
    let mut runs: Vec<RowRun> = Vec::new();
    for &row in rows {
        match runs.last_mut() {
            Some(run) if run.first_row.checked_add(run.count) == Some(row) => run.count += 1,
            _ => runs.push(RowRun {
                first_row: row,
                count: 1,
            }),
        }
    }
    runs
}

/// Number of maximal runs of consecutive rows in `rows` (in order).
pub fn count_runs(rows: &[u32]) -> usize {
    rows.windows(2)
        .filter(|w| w[0].checked_add(1) != Some(w[1]))
        .count()
        + usize::from(!rows.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_break_at_gaps_and_descents() {
        let rows = [3, 4, 5, 9, 8, 10, 11];
        assert_eq!(
            row_runs(&rows),
            vec![
                RowRun {
                    first_row: 3,
                    count: 3
                },
                RowRun {
                    first_row: 9,
                    count: 1
                },
                RowRun {
                    first_row: 8,
                    count: 1
                },
                RowRun {
                    first_row: 10,
                    count: 2
                },
            ]
        );
        assert_eq!(count_runs(&rows), 4);
        assert_eq!(count_runs(&[]), 0);
        assert_eq!(count_runs(&[u32::MAX, 0]), 2);
        assert!(row_runs(&[]).is_empty());
    }
}
