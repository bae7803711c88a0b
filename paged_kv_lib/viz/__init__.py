"""Pictures of the allocator at work: live ipywidgets views, static SVG, matplotlib plots.

``BlockTableView``, ``FreeQueueView`` and ``AddressTranslationView`` draw one allocator's
state (static by default, ``.widget()`` for a live one); ``Playground`` adds buttons that
drive a real allocator; ``plots`` holds the course's matplotlib charts (``plot_results`` draws a simulation's rows).
"""

from .colors import MEMORY_PARTS, SEQUENCE_PALETTE, seq_color
from .playground import Playground
from .plots import plot_memory_breakdown, plot_results, plot_usage_over_time
from .static import interact, with_picture
from .views import AddressTranslationView, BlockTableView, FreeQueueView

__all__ = [
    "AddressTranslationView",
    "BlockTableView",
    "FreeQueueView",
    "MEMORY_PARTS",
    "Playground",
    "SEQUENCE_PALETTE",
    "interact",
    "plot_memory_breakdown",
    "plot_results",
    "plot_usage_over_time",
    "seq_color",
    "with_picture",
]
