"""One module per pipeline stage, each with one public function that writes one output folder."""
