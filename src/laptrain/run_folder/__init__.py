"""A run's folder: how it is named and chosen on resume (``naming``), the one live process that
holds it (``lock``), and what ``laptrain runs`` lists from it (``listing``)."""
