"""The policies a valuing strategy applies to clients: whom it samples (:mod:`.sampling`,
:mod:`.selection`), whose valued reply it aggregates (:mod:`.acceptance`) and how it reviews the
weights clients claim (:mod:`.claims`). Each takes the books' values or replies; none talks to Flower."""
