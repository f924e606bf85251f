"""The main job: noisy clients valued by within-round ADS and LOO (:mod:`.noisy_clients`), its many-seed study (:mod:`.study`) and its Flower App (:mod:`.flower_app`)."""
