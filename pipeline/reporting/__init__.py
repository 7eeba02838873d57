"""What a run shows people: intervals and paired tests, the report, the plots."""
