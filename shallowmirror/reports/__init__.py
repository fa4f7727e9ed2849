"""Reports: PySpark jobs over engine metrics and benchmark results, and the HTML report."""
