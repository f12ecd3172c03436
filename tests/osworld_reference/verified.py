"""The metrics OSWorld-Verified added, which ``tests/test_osworld_differential_verified.py`` checks (the general and
office differential checks leave them to it)."""

# Only on OSWorld's main branch (not in desktop-env 1.0.2), with the module that has them there.
MAIN_ONLY = {"check_structure_sim_with_threshold": "gimp", "check_play_and_exit": "vlc"}
VERIFIED = frozenset(
    {
        "match_in_list",
        "is_expected_active_tab_approximate",
        "compare_unique_train_records",
        "compare_image_text",
        *MAIN_ONLY,
    }
)
