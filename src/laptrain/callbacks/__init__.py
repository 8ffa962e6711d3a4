"""Lightning callbacks that fill gaps in what Lightning ships."""
