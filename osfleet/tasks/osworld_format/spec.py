"""The parts of an OSWorld task file, one typed model each: set-up steps and getters.

These models are the published request schema as well as the parser (see ``convert.py``), so each one says
what OSWorld's own code needs of it (``desktop_env/controllers/setup.py`` for steps, ``evaluators/getters``
for getters) and no more: keys OSWorld ignores are allowed and ignored, keys it reads are typed. Paths may be
absolute, ``~``-relative, ``$HOME``-based or relative to the home folder, as OSWorld's server resolves them
(``guest_paths.guest_path``).

What cannot run on a replica without the internet or a Google account is not modelled here but listed in
``OFFLINE`` with the reason, so an import names it.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from osfleet.errors import OsfleetError
from osfleet.protocol.wire import JsonInt, integral
from osfleet.tasks.assets import AssetStore

log = logging.getLogger(__name__)

MAX_DOWNLOADS = 64
MAX_TABS = 32
MAX_HISTORY = 200
PATH_MAX = 4096
# The empty Chrome history database OSWorld's ``update_browse_history`` starts from (an asset like any other).
HISTORY_TEMPLATE_URL = (
    "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/chrome/"
    "44ee5668-ecd5-4366-a6ce-c1c9b8d4e938/history_empty.sqlite?download=true"
)

# Set-up step and getter types OSWorld has that need the internet or a Google account (or do not exist in
# OSWorld's code): refused with the reason, never modelled.
OFFLINE = {
    "googledrive": "needs a Google Drive account and the internet (OSWorld's googledrive set-up)",
    "login": "logs in to a web service with an account (OSWorld's login set-up)",
    "googledrive_file": "reads a file from a Google Drive account over the internet",
    "gotoRecreationPage_and_get_html_content": "scrapes the live recreation.gov site for the expected value",
    "pdf_from_url": "prints a live web page to PDF for the expected file",
    "upload_file": "uploads a file from the evaluating machine's own disk (a path on the host)",
    "tidy_desktop": "not implemented in OSWorld itself",
    "act": "not implemented in OSWorld itself",
    "replay": "not implemented in OSWorld itself",
}

GuestPath = Annotated[str, Field(min_length=1, max_length=PATH_MAX, pattern=r"^[^\x00]+$")]
Command = Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)]
# OSWorld reads its flags by truthiness (``config.get("multi", False)``), and task files also write "true".
Flag = bool | str
Shell = Flag
Url = Annotated[str, Field(min_length=1)]
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*"  # no "..", no leading dot or slash
CacheName = Annotated[str, Field(max_length=200, pattern=rf"^{_NAME}(?:/{_NAME})*$")]


def _stored_urls(*fields: str) -> Any:
    """Schema hook: each of ``fields`` (a URL, or a list of URLs) may only name URLs this host's asset store
    holds, listed when the schema is made; with none stored, no value is valid."""

    def hook(schema: dict[str, Any]) -> None:
        try:
            urls = AssetStore.from_settings().urls()
        except OsfleetError as exc:  # a broken index must not take the API's documentation down with it
            log.warning("%s; the published schema offers no downloads", exc)
            urls = []
        for name in fields:
            prop = schema["properties"][name]
            for branch in prop.get("anyOf", [prop]):  # a URL, or a list of URLs
                target = branch["items"] if branch.get("type") == "array" else branch
                if urls:
                    target["enum"] = urls
                else:
                    target["maxLength"] = 0  # with minLength 1: nothing can be asked for here
                    target["minLength"] = 1

    return hook


def _needs_stored(url: str) -> Any:
    """Schema hook: the whole object is only valid while the store holds ``url`` (a file the step starts from)."""

    def hook(schema: dict[str, Any]) -> None:
        try:
            held = url in AssetStore.from_settings().index()
        except OsfleetError:
            held = False
        if not held:
            schema["not"] = {}

    return hook


class Open(BaseModel):
    """OSWorld objects often carry keys osfleet does not use; they are allowed and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


# --- set-up and postconfig steps -----------------------------------------------------------------------------
class ExecuteParams(Open):
    command: Command
    shell: Shell = False
    stdout: CacheName | Literal[""] = Field("", description="keep the standard output as this cache file")
    stderr: CacheName | Literal[""] = Field("", description="keep the standard error as this cache file")


class LaunchParams(Open):
    command: Command
    shell: Shell = False


class SleepParams(Open):
    seconds: float = Field(1.0, ge=0, le=120)


class PathParams(Open):
    path: GuestPath


class DownloadFile(Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_stored_urls("url"))

    url: str = Field(min_length=1)
    path: GuestPath


class DownloadParams(Open):
    files: Annotated[list[DownloadFile], Field(min_length=1, max_length=MAX_DOWNLOADS)]


class WindowParams(Open):
    window_name: str = Field(min_length=1, max_length=200)
    strict: Flag = False
    by_class: Flag = False


class OpenTabsParams(Open):
    urls_to_open: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_TABS)]


class CloseTabsParams(Open):
    urls_to_close: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_TABS)]


class HistoryItem(Open):
    url: str = Field(min_length=1)
    title: str
    visit_time_from_now_in_seconds: float = Field(ge=0, le=10 * 365 * 86400)


class HistoryParams(Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_needs_stored(HISTORY_TEMPLATE_URL))

    history: Annotated[list[HistoryItem], Field(max_length=MAX_HISTORY)]


class ExecuteStep(Open):
    type: Literal["execute", "command"]
    parameters: ExecuteParams


class LaunchStep(Open):
    type: Literal["launch"]
    parameters: LaunchParams


class SleepStep(Open):
    type: Literal["sleep"]
    parameters: SleepParams = SleepParams()


class OpenStep(Open):
    type: Literal["open"]
    parameters: PathParams


class DownloadStep(Open):
    type: Literal["download"]
    parameters: DownloadParams


class WindowStep(Open):
    type: Literal["activate_window", "close_window"]
    parameters: WindowParams


class ChromeOpenTabsStep(Open):
    type: Literal["chrome_open_tabs"]
    parameters: OpenTabsParams


class ChromeCloseTabsStep(Open):
    type: Literal["chrome_close_tabs"]
    parameters: CloseTabsParams


class BrowseHistoryStep(Open):
    type: Literal["update_browse_history"]
    parameters: HistoryParams


class WallpaperStep(Open):
    type: Literal["change_wallpaper"]
    parameters: PathParams


AnyStep = (
    ExecuteStep
    | LaunchStep
    | SleepStep
    | OpenStep
    | DownloadStep
    | WindowStep
    | ChromeOpenTabsStep
    | ChromeCloseTabsStep
    | BrowseHistoryStep
    | WallpaperStep
)
OsworldStep = Annotated[AnyStep, Field(discriminator="type")]
SETUP_TYPES = (
    "execute",
    "command",
    "launch",
    "sleep",
    "open",
    "download",
    "activate_window",
    "close_window",
    "chrome_open_tabs",
    "chrome_close_tabs",
    "update_browse_history",
    "change_wallpaper",
)


# --- getters (an evaluator's result and expected) ------------------------------------------------------------
class _Files(Open):
    """One file, or with ``multi`` several (``path`` and ``dest`` lists); ``gives``: which reach the metric."""

    multi: Flag = False
    gives: Annotated[
        list[Annotated[int, Field(ge=0, le=63), BeforeValidator(integral)]], Field(min_length=1, max_length=64)
    ] = [0]


class VmFile(_Files):
    type: Literal["vm_file"]
    path: GuestPath | Annotated[list[GuestPath], Field(min_length=1, max_length=64)]
    dest: str | list[str] | None = None
    time_suffix: Flag = False
    time_format: str = "%Y%m%d_%H%M%S"


class CloudFile(_Files):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_stored_urls("path"))

    type: Literal["cloud_file"]
    path: Url | Annotated[list[Url], Field(min_length=1, max_length=64)]
    dest: str | list[str] | None = None


class CacheFile(Open):
    type: Literal["cache_file"]
    path: CacheName


class VmCommand(Open):
    type: Literal["vm_command_line", "vm_command_error"]
    command: Command
    shell: Shell = False


class RuleGetter(Open):
    type: Literal["rule"]
    rules: Any = None


class RelativeTime(Open):
    from_: str = Field(alias="from", min_length=1)
    to: str | None = None


class RelativeRules(Open):
    relativeTime: RelativeTime  # noqa: N815 (OSWorld's key)
    expected: dict[str, Any] = {}
    timezone: str | None = None


class RuleRelativeTime(Open):
    type: Literal["rule_relativeTime"]
    rules: RelativeRules


class ConstantGetter(Open):
    type: Literal["constant"]
    value: Any = None


class TimeDiffRange(Open):
    type: Literal["time_diff_range"]
    diff_range_in_minutes: Any = None


class NoParams(Open):
    """Getters whose value depends only on the guest's state."""

    type: Literal[
        "accessibility_tree",
        "vm_terminal_output",
        "vm_screen_size",
        "open_tabs_info",
        "bookmarks",
        "profile_name",
        "default_search_engine",
        "chrome_font_size",
        "chrome_language",
        "enabled_experiments",
        "enable_do_not_track",
        "enable_enhanced_safety_browsing",
        "enable_safe_browsing",
        "new_startup_page",
        "data_delete_automacally",
        "find_unpacked_extension_path",
        "find_installed_extension_name",
        "shortcuts_on_desktop",
        "default_video_player",
        "chrome_appearance_mode_ui",
    ]


class ToFile(Open):
    """Getters that save what they read as a file named ``dest`` (the metric gets the file)."""

    type: Literal["history", "cookie_data", "vlc_config", "vlc_playing_info", "vm_wallpaper"]
    dest: str = "file"


class WindowSize(Open):
    type: Literal["vm_window_size"]
    app_class_name: str = Field(min_length=1, max_length=200)


class ListDirectory(Open):
    type: Literal["list_directory"]
    path: GuestPath


class GimpConfig(Open):
    type: Literal["gimp_config_file"]
    file_name: str = Field(max_length=200, pattern=r"^[^\x00/]*[^\x00/.][^\x00/]*$")
    dest: str = "gimp-config"


class VscodeConfig(Open):
    type: Literal["vscode_config"]
    vscode_extension_command: str = Field(min_length=1, max_length=500)
    path: GuestPath
    dest: str = "vscode-config"


class SlideMedia(Open):
    type: Literal["audio_in_slide", "background_image_in_slide"]
    ppt_file_path: GuestPath
    slide_index: JsonInt | str
    dest: str = "media"


class ContentFromVmFile(Open):
    type: Literal["content_from_vm_file"]
    path: GuestPath
    file_type: Literal["xlsx"]
    file_content: Literal["last_row"]


class ActiveUrl(Open):
    """The active tab's address as Chrome's address bar shows it, behind ``goto_prefix``."""

    type: Literal["active_url_from_accessTree", "active_tab_info"]
    goto_prefix: str = "https://"


class UrlParse(Open):
    type: Literal["active_tab_url_parse"]
    goto_prefix: str = "https://"
    parse_keys: list[str]
    replace: dict[str, str] = {}
    split_list: Flag = False


class UrlPathParse(Open):
    type: Literal["url_path_parse", "macys_product_url_parse"]
    goto_prefix: str = "https://"
    parse_keys: list[str]


class UrlDashPart(Open):
    type: Literal["url_dashPart"]
    goto_prefix: str = "https://"
    partIndex: JsonInt | str  # noqa: N815 (OSWorld's keys)
    needDeleteId: Flag = False  # noqa: N815
    returnType: Literal["string", "json"]  # noqa: N815
    key: str = ""


class HtmlParse(Open):
    type: Literal["active_tab_html_parse"]
    goto_prefix: str = "https://"
    category: Literal["class", "label", "xpath", "input", "class&url"]
    class_singleObject: dict[str, str] = {}  # noqa: N815 (OSWorld's keys)
    class_multiObject: dict[str, Any] = {}  # noqa: N815
    class_multiObject_child: dict[str, dict[str, str]] = {}  # noqa: N815
    class_multiObject_only_child: dict[str, dict[str, str]] = {}  # noqa: N815
    class_multiObject_search_exist: dict[str, list[str]] = {}  # noqa: N815
    class_multiObject_li: dict[str, list[str]] = {}  # noqa: N815
    labelObject: dict[str, str] = {}  # noqa: N815
    xpathObject: dict[str, str] = {}  # noqa: N815
    inputObject: dict[str, str] = {}  # noqa: N815
    url_include_expected: list[str] = []
    url_include_expected_multichoice: dict[str, str] = {}


class PageInfo(Open):
    type: Literal["page_info"]
    url: str = Field(min_length=1)


class InfoFromWebsite(Open):
    type: Literal["info_from_website"]
    url: str = Field(min_length=1)
    infos: list[dict[str, Any]] = []
    backups: Any = None


AnyGetter = (
    VmFile
    | CloudFile
    | CacheFile
    | VmCommand
    | RuleGetter
    | RuleRelativeTime
    | ConstantGetter
    | TimeDiffRange
    | NoParams
    | ToFile
    | WindowSize
    | ListDirectory
    | GimpConfig
    | VscodeConfig
    | SlideMedia
    | ContentFromVmFile
    | ActiveUrl
    | UrlParse
    | UrlPathParse
    | UrlDashPart
    | HtmlParse
    | PageInfo
    | InfoFromWebsite
)
Getter = Annotated[AnyGetter, Field(discriminator="type")]


def _types(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(model.model_fields["type"].annotation.__args__)  # type: ignore[union-attr]


GETTER_TYPES: tuple[str, ...] = tuple(t for m in AnyGetter.__args__ for t in _types(m))
